"""The device plugin interface (fingerprint, reserve, stats, close) and what every plugin
shares: the GPU record, interconnect groups, no GPUs at all, and what the node publishes."""

from __future__ import annotations

import json
import logging
import re
import uuid as uuidlib
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from gpufleet.agent.runtime.base import GPUAssignment
from gpufleet.agent.runtime.gpuenv import gpu_env
from gpufleet.api.gpu import GPU_COUNT_LABEL, GPU_MEMORY_LABEL, GPU_PRODUCT_LABEL

log = logging.getLogger(__name__)

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"


# Stable namespace for the UUIDs of declared GPUs: the same node name and index always
# give the same UUID, across agent restarts and machines.
_DECLARED_NAMESPACE = uuidlib.UUID("8b7f4f3e-6a55-4c43-9d5e-0c1f6d2b9a71")



class NoGPUs(Exception):
    """NVML is not usable here (library missing, driver not loaded): fall back."""


@dataclass
class GPU:
    index: int
    uuid: str
    # Label-safe product name, the value of nvidia.com/gpu.product ("H100-80GB-HBM3").
    model: str
    memory_mib: int
    mig_mode: bool | None = None
    nvlink_peers: list[int] = field(default_factory=list)
    # Interconnect domain: GPUs that share a group talk over NVLink ("nvlink-N") or at
    # least share a PCIe switch ("pcie-N"). Unique within the node.
    group: str = ""
    health: Literal["Healthy", "Unhealthy"] = HEALTHY
    health_reason: str = ""
    pci_bus_id: str | None = None

    @property
    def healthy(self) -> bool:
        return self.health == HEALTHY


@dataclass(frozen=True)
class GPUStats:
    utilization_pct: float
    memory_used_mib: int
    memory_total_mib: int
    temperature_c: float | None = None
    power_w: float | None = None


class DevicePlugin(Protocol):
    name: str

    def fingerprint(self) -> list[GPU]:
        """Every GPU of the node, healthy or not, ordered by index."""

    def reserve(self, indices: Sequence[int]) -> dict[str, str]:
        """The environment that hands a container exactly these GPUs. Raises ValueError for
        an index the node does not have."""

    def stats(self) -> dict[int, GPUStats]:
        """Per-GPU utilization; a GPU that cannot be read is left out."""

    def close(self) -> None: ...


def normalize_model(name: str) -> str:
    """NVML's product name as a label value: "NVIDIA H100 80GB HBM3" -> "H100-80GB-HBM3".

    The vendor prefix is dropped because every device here is NVIDIA's and selectors read
    better without it; anything a label value cannot hold becomes a dash."""
    s = re.sub(r"^\s*NVIDIA[\s_-]+", "", name, flags=re.IGNORECASE)
    s = re.sub(r"[^A-Za-z0-9._-]+", "-", s)
    s = re.sub(r"-{2,}", "-", s).strip("-._")
    return s[:63].rstrip("-._") or "unknown"


def _reserve(gpus: Sequence[GPU], indices: Sequence[int]) -> dict[str, str]:
    by_index = {g.index: g for g in gpus}
    missing = [i for i in indices if i not in by_index]
    if missing:
        raise ValueError(f"no GPU with index {', '.join(map(str, missing))} on this node")
    return gpu_env([GPUAssignment(i, by_index[i].uuid) for i in indices])


# --- groups ---------------------------------------------------------------------------


def interconnect_groups(
    indices: Sequence[int],
    nvlink_edges: Iterable[tuple[int, int]],
    pcie_edges: Iterable[tuple[int, int]] = (),
) -> dict[int, str]:
    """Each GPU's interconnect domain: GPUs joined by NVLink (directly or through NVSwitch)
    form "nvlink-<lowest index>"; the rest are grouped by shared PCIe switch into
    "pcie-<lowest index>", a GPU alone being its own group."""
    parent = {i: i for i in indices}

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def union(a: int, b: int) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)

    nvlinked: set[int] = set()
    for a, b in nvlink_edges:
        if a in parent and b in parent and a != b:
            union(a, b)
            nvlinked.update((a, b))
    for a, b in pcie_edges:
        # NVLink already names the domain; PCIe only groups what NVLink left alone.
        if a in parent and b in parent and a not in nvlinked and b not in nvlinked:
            union(a, b)
    return {i: (f"nvlink-{find(i)}" if i in nvlinked else f"pcie-{find(i)}") for i in indices}


class NoDevices:
    name = "none"

    def fingerprint(self) -> list[GPU]:
        return []

    def reserve(self, indices: Sequence[int]) -> dict[str, str]:
        return _reserve([], indices)

    def stats(self) -> dict[int, GPUStats]:
        return {}

    def close(self) -> None:
        pass


# --- what the node publishes ----------------------------------------------------------


def node_gpu_annotation(gpus: Sequence[GPU]) -> str:
    """The value of the Node annotation gpufleet.io/gpus, which the scheduler reads."""
    out = []
    for g in sorted(gpus, key=lambda g: g.index):
        d: dict[str, Any] = {
            "index": g.index,
            "uuid": g.uuid,
            "model": g.model,
            "memoryMiB": g.memory_mib,
            "health": g.health,
            "group": g.group,
        }
        if g.nvlink_peers:
            d["nvlinkPeers"] = list(g.nvlink_peers)
        if g.health_reason:
            d["reason"] = g.health_reason
        out.append(d)
    return json.dumps(out, separators=(",", ":"))


def parse_node_gpu_annotation(value: str) -> list[dict[str, Any]]:
    return json.loads(value) if value else []


def node_gpu_labels(gpus: Sequence[GPU]) -> dict[str, str]:
    """nvidia.com/gpu.* labels as GPU feature discovery sets them. A node with mixed models
    is labelled with its most common one."""
    if not gpus:
        return {}
    model = Counter(g.model for g in gpus).most_common(1)[0][0]
    memory = min(g.memory_mib for g in gpus if g.model == model)
    return {GPU_PRODUCT_LABEL: model, GPU_MEMORY_LABEL: str(memory), GPU_COUNT_LABEL: str(len(gpus))}
