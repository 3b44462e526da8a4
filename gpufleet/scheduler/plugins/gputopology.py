"""GPUTopology: which GPUs of the chosen node the pod gets.

GPUs talk fastest inside their interconnect (NVLink) group, so a pod's GPUs should sit in
one group whenever the node has a group with enough free GPUs. Among such groups the
tightest fit is taken (best fit), which keeps the larger free groups whole for larger
pods; only when no group is big enough are GPUs taken across groups, largest groups first
so as few groups as possible are touched.

- Filter: the node must have enough free *healthy* GPUs at known indices (NodeResourcesFit
  only counts), and a pod annotated ``gpufleet.io/gpu-topology: same-group`` needs one
  group that holds all of them.
- Score: 50-100 for a single-group fit (100 when the pod fills the group exactly), below
  50 for a placement across groups.
- Reserve: picks the indices and leaves them in the CycleState (``GPU_INDICES_KEY``); the
  scheduler cache then marks them used when it assumes the pod.
- The binder hands them over as the annotation ``gpufleet.io/gpu-indices`` on the Binding,
  which the API server copies onto the pod in the same write that sets its node, so the
  node agent never sees the pod on its node without its GPUs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpufleet.api.gpu import (
    GPU_TOPOLOGY_ANNOTATION,
    SAME_GROUP,
)
from gpufleet.scheduler.framework import (
    GPU_INDICES_KEY,
    MAX_NODE_SCORE,
    NODE_ADD,
    NODE_ALLOCATABLE,
    NODE_ANNOTATION,
    OK,
    POD_DELETE,
    SKIP,
    CycleState,
    FrameworkHandle,
    Status,
)
from gpufleet.scheduler.snapshot import NodeInfo, PodInfo, Snapshot

NOT_ENOUGH_HEALTHY = "node(s) didn't have enough free healthy GPUs"
NO_SINGLE_GROUP = "node(s) couldn't fit the pod's GPUs in one interconnect group"

_SAME_GROUP_KEY = "GPUTopology/same-group"
_HALF = MAX_NODE_SCORE // 2


def wants_same_group(pod_info: PodInfo) -> bool:
    return pod_info.annotations.get(GPU_TOPOLOGY_ANNOTATION, "").strip() == SAME_GROUP


def choose_gpus(node_info: NodeInfo, count: int, same_group: bool = False) -> tuple[int, ...] | None:
    """The indices to give a pod needing ``count`` GPUs, or None when the node cannot."""
    if count <= 0:
        return ()
    groups = node_info.free_gpus
    fitting = [(len(free), group) for group, free in groups.items() if len(free) >= count]
    if fitting:
        _, group = min(fitting)
        return tuple(sorted(groups[group])[:count])
    if same_group:
        return None
    chosen: list[int] = []
    for _, free in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        chosen.extend(sorted(free)[: count - len(chosen)])
        if len(chosen) == count:
            return tuple(sorted(chosen))
    return None


def placement_score(node_info: NodeInfo, count: int) -> int:
    best = 0
    sizes = []
    for free in node_info.free_gpus.values():
        size = len(free)
        sizes.append(size)
        if size >= count and (best == 0 or size < best):
            best = size
    if best:
        return _HALF + _HALF * count // best
    taken = groups = 0
    for size in sorted(sizes, reverse=True):
        taken += size
        groups += 1
        if taken >= count:
            return _HALF * count // (taken * groups)
    return 0


class GPUTopology:
    name = "GPUTopology"

    def __init__(self, args: Mapping[str, Any] | None = None, handle: FrameworkHandle | None = None) -> None:
        self.handle = handle or FrameworkHandle()

    def pre_filter(self, state: CycleState, pod_info: PodInfo, snapshot: Snapshot) -> Status:
        if not pod_info.gpus:
            return SKIP
        state.write(_SAME_GROUP_KEY, wants_same_group(pod_info))
        return OK

    def filter(self, state: CycleState, pod_info: PodInfo, node_info: NodeInfo) -> Status:
        count = pod_info.gpus
        free = node_info.free_gpu_total - node_info.unindexed_gpus
        if free < count:
            return Status.unschedulable(
                NOT_ENOUGH_HEALTHY,
                detail=f"{NOT_ENOUGH_HEALTHY} (requested {count}, free healthy {max(free, 0)})",
            )
        if state.read(_SAME_GROUP_KEY):
            largest = max((len(s) for s in node_info.free_gpus.values()), default=0)
            if largest < count:
                return Status.unschedulable(
                    NO_SINGLE_GROUP,
                    detail=f"{NO_SINGLE_GROUP} (requested {count}, largest free group {largest})",
                )
        return OK

    def filter_nodes(self, state: CycleState, pod_info: PodInfo, nodes: list[NodeInfo]) -> list[NodeInfo]:
        if state.read(_SAME_GROUP_KEY):
            return [n for n in nodes if not self.filter(state, pod_info, n).code]
        count = pod_info.gpus
        return [n for n in nodes if n.free_gpu_total - n.unindexed_gpus >= count]

    def pre_score(self, state: CycleState, pod_info: PodInfo, nodes: list[NodeInfo]) -> Status:
        return OK if pod_info.gpus else SKIP

    def score(self, state: CycleState, pod_info: PodInfo, node_info: NodeInfo) -> int:
        return placement_score(node_info, pod_info.gpus)

    def score_key(self, state: CycleState, pod_info: PodInfo) -> int:
        return pod_info.gpus

    def score_nodes(self, state: CycleState, pod_info: PodInfo, nodes: list[NodeInfo]) -> list[int]:
        count = pod_info.gpus
        return [placement_score(n, count) for n in nodes]

    def reserve(self, state: CycleState, pod_info: PodInfo, node_name: str) -> Status:
        if not pod_info.gpus:
            return OK
        snapshot = self.handle.snapshot
        node_info = snapshot.get(node_name) if snapshot is not None else None
        if node_info is None:
            return Status.unschedulable(NOT_ENOUGH_HEALTHY, detail=f"node {node_name} is not in the snapshot")
        indices = choose_gpus(node_info, pod_info.gpus, wants_same_group(pod_info))
        if indices is None:
            return Status.unschedulable(NOT_ENOUGH_HEALTHY)
        state.write(GPU_INDICES_KEY, indices)
        return OK

    def unreserve(self, state: CycleState, pod_info: PodInfo, node_name: str) -> None:
        state.delete(GPU_INDICES_KEY)

    def events_to_register(self) -> set[str]:
        return {NODE_ADD, NODE_ALLOCATABLE, NODE_ANNOTATION, POD_DELETE}
