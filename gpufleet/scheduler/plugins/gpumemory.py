"""GPUMemory: a pod annotated ``gpufleet.io/gpu-memory-min: "40000"`` (MiB) fits only nodes
whose GPUs have at least that much memory each.

A node's GPU memory is its ``nvidia.com/gpu.memory`` label (MiB, as NVIDIA's GPU feature
discovery publishes it), else the smallest ``memoryMiB`` in its ``gpufleet.io/gpus``
inventory. On a real Kubernetes cluster the same constraint is node affinity with
``Gt`` on that label; the annotation is the shorthand.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpufleet.api.gpu import GPU_MEMORY_MIN_ANNOTATION
from gpufleet.scheduler.framework import NODE_ADD, NODE_ANNOTATION, NODE_LABEL, OK, SKIP, CycleState, Status
from gpufleet.scheduler.snapshot import NodeInfo, PodInfo, Snapshot

_STATE_KEY = "GPUMemory/min-mib"
NO_GPUS = "node(s) had no GPUs"
UNKNOWN_MEMORY = "node(s) didn't publish their GPU memory"


def too_small_reason(minimum_mib: int) -> str:
    return f"node(s) had GPUs with less than {minimum_mib} MiB memory"


class GPUMemory:
    name = "GPUMemory"

    def __init__(self, args: Mapping[str, Any] | None = None, handle: Any = None) -> None:
        pass

    def pre_filter(self, state: CycleState, pod_info: PodInfo, snapshot: Snapshot) -> Status:
        text = pod_info.annotations.get(GPU_MEMORY_MIN_ANNOTATION)
        if text is None:
            return SKIP
        text = text.strip()
        if not text.isdigit():
            return Status.unresolvable(
                f"invalid {GPU_MEMORY_MIN_ANNOTATION} annotation {text!r}: must be a whole number of MiB"
            )
        state.write(_STATE_KEY, int(text))
        return OK

    def filter(self, state: CycleState, pod_info: PodInfo, node_info: NodeInfo) -> Status:
        minimum = state.read(_STATE_KEY)
        if minimum is None:
            return OK
        memory = node_info.gpu_memory_mib
        if memory is not None and memory >= minimum:
            return OK
        if memory is None:
            if not node_info.gpu_devices:
                return Status.unresolvable(NO_GPUS)
            return Status.unresolvable(UNKNOWN_MEMORY)
        return Status.unresolvable(
            too_small_reason(minimum), detail=f"{too_small_reason(minimum)} (has {memory} MiB)"
        )

    def events_to_register(self) -> set[str]:
        return {NODE_ADD, NODE_LABEL, NODE_ANNOTATION}
