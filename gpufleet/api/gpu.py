"""The GPU vocabulary every component shares: resource, label and annotation names, and
the parsing of a node's per-GPU inventory and of a pod's GPU assignment.

A node publishes its devices in the annotation ``gpufleet.io/gpus`` (a JSON list of
``{"index", "uuid", "model", "memoryMiB", "health", "group"}``); the scheduler records the
indices it gave a pod in the pod annotation ``gpufleet.io/gpu-indices`` ("0,1"), which the
agent turns into ``CUDA_VISIBLE_DEVICES``. That annotation is the only record of which
physical GPU belongs to which pod, so nothing may assign an index twice.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
# Labels GPU feature discovery sets start with this ("nvidia.com/gpu.product", ...).
GPU_LABEL_PREFIX = "nvidia.com/gpu."
ZONE_LABEL = "topology.kubernetes.io/zone"
RACK_LABEL = "gpufleet.io/rack"

GPUS_ANNOTATION = "gpufleet.io/gpus"
GPU_INDICES_ANNOTATION = "gpufleet.io/gpu-indices"
GPU_TOPOLOGY_ANNOTATION = "gpufleet.io/gpu-topology"
GPU_MEMORY_MIN_ANNOTATION = "gpufleet.io/gpu-memory-min"
# Written by the scheduler next to the PodScheduled condition: why each node was rejected,
# one "node: reason" line each, for `describe pod`.
SCHEDULING_DIAGNOSIS_ANNOTATION = "gpufleet.io/scheduling-diagnosis"

SAME_GROUP = "same-group"
HEALTHY = "Healthy"
# The interconnect group of GPUs on a node that publishes no per-GPU detail.
DEFAULT_GROUP = ""


@dataclass(frozen=True, slots=True)
class GPUDevice:
    index: int
    uuid: str = ""
    model: str = ""
    memory_mib: int | None = None
    healthy: bool = True
    group: str = DEFAULT_GROUP


@functools.lru_cache(maxsize=8192)
def parse_gpus_annotation(text: str) -> tuple[GPUDevice, ...] | None:
    """The devices in a ``gpufleet.io/gpus`` annotation, by index; None when it is unreadable.

    Nodes of one fleet publish a handful of distinct inventories, and a node update repeats
    its annotation unchanged, so parsing is memoized on the text.
    """
    try:
        raw = json.loads(text)
    except ValueError:
        log.warning("unreadable %s annotation: %.200s", GPUS_ANNOTATION, text)
        return None
    if not isinstance(raw, list):
        return None
    devices: dict[int, GPUDevice] = {}
    for item in raw:
        if not isinstance(item, dict):
            continue
        index = item.get("index")
        if isinstance(index, bool) or not isinstance(index, int) or index < 0 or index in devices:
            continue
        memory = item.get("memoryMiB")
        group = item.get("group")
        devices[index] = GPUDevice(
            index=index,
            uuid=str(item.get("uuid") or ""),
            model=str(item.get("model") or ""),
            memory_mib=memory if isinstance(memory, int) and not isinstance(memory, bool) else None,
            healthy=item.get("health", HEALTHY) == HEALTHY,
            group=str(group) if group is not None else DEFAULT_GROUP,
        )
    return tuple(devices[i] for i in sorted(devices))


@functools.lru_cache(maxsize=8192)
def parse_gpu_indices(text: str) -> tuple[int, ...]:
    """The indices in a ``gpufleet.io/gpu-indices`` annotation ("0,1"); junk entries are skipped
    and duplicates dropped, so a hand-edited annotation cannot count one GPU twice."""
    seen: dict[int, None] = {}
    for part in text.split(","):
        part = part.strip()
        if part.isdigit():
            seen.setdefault(int(part), None)
    return tuple(seen)


def format_gpu_indices(indices: Iterable[int]) -> str:
    """The ``gpufleet.io/gpu-indices`` value for a set of indices: sorted, comma-separated."""
    return ",".join(str(i) for i in sorted(indices))


# -- GPU health ------------------------------------------------------------------------------

# The reason a pod stopped because its GPU failed carries (status.reason and its
# DisruptionTarget condition), and the reason of the node's GPUHealthy condition.
GPU_UNHEALTHY_REASON = "GPUUnhealthy"
DISRUPTION_TARGET = "DisruptionTarget"

# DisruptionTarget reasons that mean the pod's hardware or its node failed under it, not the
# work itself: the node agent's GPUUnhealthy (a GPU fell off the bus, an XID such as 79), and
# Kubernetes' DeletionByTaintManager (NoExecute taint of a node not Ready or unreachable) and
# DeletionByPodGC (the pod's node is gone). Not among them: PreemptionByScheduler and
# EvictionByEvictionAPI (voluntary: someone chose to stop the pod, and the pod is deleted, so
# controllers see it lost) and TerminationByKubelet (node-pressure eviction, which the pod's
# own memory or disk use may have caused).
HARDWARE_DISRUPTION_REASONS = frozenset({GPU_UNHEALTHY_REASON, "DeletionByTaintManager", "DeletionByPodGC"})


def _get(obj: Any, wire: str, attr: str) -> Any:
    if isinstance(obj, dict):
        return obj.get(wire)
    return getattr(obj, attr, None)


def hardware_disruption(pod: Any) -> Any:
    """The DisruptionTarget condition (model or wire dict) of a Failed pod that says its
    hardware or node failed under it, else None."""
    status = _get(pod, "status", "status")
    if status is None or _get(status, "phase", "phase") != "Failed":
        return None
    for c in _get(status, "conditions", "conditions") or []:
        if (_get(c, "type", "type") == DISRUPTION_TARGET and _get(c, "status", "status") == "True"
                and _get(c, "reason", "reason") in HARDWARE_DISRUPTION_REASONS):
            return c
    return None


def pod_failed_by_hardware(pod: Any) -> bool:
    """Whether a pod (model or wire dict) is Failed because its hardware or node failed: phase
    Failed with condition DisruptionTarget True and a reason of ``HARDWARE_DISRUPTION_REASONS``.
    Controllers move such work to healthy GPUs without counting it as the work's failure."""
    return hardware_disruption(pod) is not None
