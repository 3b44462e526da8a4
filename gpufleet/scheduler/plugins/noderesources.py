"""NodeResourcesFit: the pod's requests must fit in what the node has left (cpu, memory,
nvidia.com/gpu, any other extended resource, and the pod count); nodes are ranked by how
allocated they would be afterwards.

Scoring strategies:
- MostAllocated (bin-packing, the default here): fuller nodes score higher, so small jobs
  fill partly used servers and whole servers stay free for the jobs that need all 8 GPUs.
- LeastAllocated (spreading): emptier nodes score higher.
Each resource's score is weighted; a resource the pod does not request is left out of
the average for extended resources (a cpu-only pod is not ranked by GPUs), as in
Kubernetes. cpu and memory are scored with non-zero defaults for request-less containers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpufleet.api.gpu import GPU_RESOURCE
from gpufleet.api.quantity import format_quantity
from gpufleet.scheduler.framework import (
    MAX_NODE_SCORE,
    NODE_ADD,
    NODE_ALLOCATABLE,
    OK,
    POD_DELETE,
    POD_UPDATE,
    Code,
    CycleState,
    Status,
)
from gpufleet.scheduler.profile import LEAST_ALLOCATED, MOST_ALLOCATED, SCORING_STRATEGIES
from gpufleet.scheduler.snapshot import CPU, MEMORY, PODS, NodeInfo, PodInfo

TOO_MANY_PODS = "Too many pods"

# GPUs weigh four times cpu or memory: for a GPU pod, where its GPUs land decides
# fragmentation far more than where its cpu does.
DEFAULT_RESOURCES: tuple[tuple[str, int], ...] = ((CPU, 1), (MEMORY, 1), (GPU_RESOURCE, 4))


def insufficient_reason(resource: str) -> str:
    return f"Insufficient {resource}"


def _format(resource: str, amount: int) -> str:
    if resource == CPU:
        return format_quantity(f"{amount}m", "cpu")
    if resource == MEMORY:
        return format_quantity(amount, "memory")
    return str(amount)


class NodeResourcesFit:
    name = "NodeResourcesFit"

    def __init__(self, args: Mapping[str, Any] | None = None, handle: Any = None) -> None:
        args = args or {}
        strategy = args.get("scoringStrategy") or {}
        self.strategy = strategy.get("type", MOST_ALLOCATED)
        if self.strategy not in SCORING_STRATEGIES:
            raise ValueError(
                f"NodeResourcesFit scoringStrategy.type must be one of {', '.join(SCORING_STRATEGIES)}, "
                f"not {self.strategy!r}"
            )
        resources = strategy.get("resources")
        if resources is None:
            self.resources = DEFAULT_RESOURCES
        else:
            self.resources = tuple((str(r["name"]), int(r.get("weight", 1))) for r in resources)
        if any(weight <= 0 for _, weight in self.resources):
            raise ValueError("NodeResourcesFit resource weights must be positive")
        self.ignored = frozenset(args.get("ignoredResources") or ())
        self.ignored_groups = frozenset(args.get("ignoredResourceGroups") or ())
        # Answers kept on nodes are this instance's (its arguments decide them).
        self._memo_token = object()

    def _ignored(self, resource: str) -> bool:
        return resource in self.ignored or resource.partition("/")[0] in self.ignored_groups

    # -- filter ---------------------------------------------------------------------------

    def filter(self, state: CycleState, pod_info: PodInfo, node_info: NodeInfo) -> Status:
        # A full node turns away pods of one shape cycle after cycle (when none fits and
        # every node must say why): its answer is kept on the node until the node changes.
        key = self._memo_key(pod_info)
        status = node_info.memo.get(key)
        if status is None:
            status = node_info.memo[key] = self._filter(pod_info, node_info)
        return status

    def filter_nodes(self, state: CycleState, pod_info: PodInfo, nodes: list[NodeInfo]) -> list[NodeInfo]:
        if pod_info.scalar:
            return [n for n in nodes if not self.filter(state, pod_info, n).code]
        cpu, memory, gpus = pod_info.cpu, pod_info.memory, pod_info.gpus
        # Exactly filter()'s answer: the *_left figures never go below zero, so a zero
        # request fits even an over-committed node here too.
        return [
            n
            for n in nodes
            if n.pods_left > 0 and cpu <= n.cpu_left and memory <= n.memory_left and gpus <= n.gpus_left
        ]

    def filter_statuses(self, state: CycleState, pod_info: PodInfo, nodes: list[NodeInfo]) -> list[Status]:
        key = self._memo_key(pod_info)
        statuses = [n.memo.get(key) for n in nodes]
        # Not "None in statuses": that would call Status.__eq__ on every element.
        for i in [i for i, status in enumerate(statuses) if status is None]:
            node_info = nodes[i]
            statuses[i] = node_info.memo[key] = self._filter(pod_info, node_info)
        return statuses  # type: ignore[return-value]

    def _memo_key(self, pod_info: PodInfo) -> tuple:
        return (
            self._memo_token,
            pod_info.cpu,
            pod_info.memory,
            pod_info.gpus,
            tuple(pod_info.scalar.items()),
        )

    def _filter(self, pod_info: PodInfo, node_info: NodeInfo) -> Status:
        short: list[tuple[str, int, int, int]] = []
        alloc_pods = node_info.alloc_pods
        if alloc_pods is not None and len(node_info.pods) >= alloc_pods:
            short.append((PODS, 1, alloc_pods - len(node_info.pods), alloc_pods))
        for resource, requested, allocatable, used in (
            (CPU, pod_info.cpu, node_info.alloc_cpu, node_info.req_cpu),
            (MEMORY, pod_info.memory, node_info.alloc_memory, node_info.req_memory),
            (GPU_RESOURCE, pod_info.gpus, node_info.alloc_gpus, node_info.req_gpus),
        ):
            if requested and requested > allocatable - used:
                short.append((resource, requested, allocatable - used, allocatable))
        alloc, req = node_info.alloc_scalar, node_info.req_scalar
        for resource, requested in pod_info.scalar.items():
            free = alloc.get(resource, 0) - req.get(resource, 0)
            if requested > free and not self._ignored(resource):
                short.append((resource, requested, free, alloc.get(resource, 0)))
        return self._rejection(short) if short else OK

    def _rejection(self, short: list[tuple[str, int, int, int]]) -> Status:
        reasons = []
        # Unresolvable when even an empty node would not do: evicting pods cannot help.
        unresolvable = True
        for resource, requested, _free, allocatable in short:
            if resource == PODS:
                reasons.append(TOO_MANY_PODS)
                unresolvable = unresolvable and allocatable == 0
            else:
                reasons.append(insufficient_reason(resource))
                unresolvable = unresolvable and requested > allocatable
        code = Code.UNSCHEDULABLE_AND_UNRESOLVABLE if unresolvable else Code.UNSCHEDULABLE
        return Status(code, reasons, detail=lambda: _details(short))

    # -- score ----------------------------------------------------------------------------

    def score(self, state: CycleState, pod_info: PodInfo, node_info: NodeInfo) -> int:
        return self.score_nodes(state, pod_info, [node_info])[0]

    def _score_terms(self, pod_info: PodInfo) -> tuple[int, int, int, tuple[tuple[str, int, int], ...]]:
        cpu_w = mem_w = gpu_w = 0
        scalars: list[tuple[str, int, int]] = []
        for resource, weight in self.resources:
            if resource == CPU:
                cpu_w = weight
            elif resource == MEMORY:
                mem_w = weight
            elif resource == GPU_RESOURCE:
                # Extended resources count only for pods that request them.
                gpu_w = weight if pod_info.gpus else 0
            elif pod_info.scalar.get(resource):
                scalars.append((resource, weight, pod_info.scalar[resource]))
        return cpu_w, mem_w, gpu_w, tuple(scalars)

    def score_key(self, state: CycleState, pod_info: PodInfo) -> tuple:
        return (
            self.strategy,
            self._score_terms(pod_info),
            pod_info.nonzero_cpu,
            pod_info.nonzero_memory,
            pod_info.gpus,
        )

    def score_nodes(self, state: CycleState, pod_info: PodInfo, nodes: list[NodeInfo]) -> list[int]:
        most = self.strategy == MOST_ALLOCATED
        cpu_w, mem_w, gpu_w, scalars = self._score_terms(pod_info)
        pod_cpu, pod_mem, pod_gpus = pod_info.nonzero_cpu, pod_info.nonzero_memory, pod_info.gpus
        top = MAX_NODE_SCORE
        out = []
        for n in nodes:
            total = weights = 0
            for weight, requested, allocatable in (
                (cpu_w, n.nonzero_cpu + pod_cpu, n.alloc_cpu),
                (mem_w, n.nonzero_memory + pod_mem, n.alloc_memory),
                (gpu_w, n.req_gpus + pod_gpus, n.alloc_gpus),
            ):
                if weight and allocatable:
                    if most:
                        ratio = top if requested >= allocatable else requested * top // allocatable
                    else:
                        ratio = (
                            0 if requested >= allocatable else (allocatable - requested) * top // allocatable
                        )
                    total += weight * ratio
                    weights += weight
            for resource, weight, amount in scalars:
                allocatable = n.alloc_scalar.get(resource, 0)
                if allocatable:
                    total += weight * _ratio(n.req_scalar.get(resource, 0) + amount, allocatable, most)
                    weights += weight
            out.append(total // weights if weights else 0)
        return out

    def events_to_register(self) -> set[str]:
        return {NODE_ADD, NODE_ALLOCATABLE, POD_DELETE, POD_UPDATE}


def _details(short: list[tuple[str, int, int, int]]) -> str:
    details = []
    for resource, requested, free, allocatable in short:
        if resource == PODS:
            details.append(f"{TOO_MANY_PODS} (limit {allocatable})")
        else:
            details.append(
                f"{insufficient_reason(resource)} (requested {_format(resource, requested)}, "
                f"free {_format(resource, max(free, 0))})"
            )
    return ", ".join(details)


def _ratio(requested: int, allocatable: int, most: bool) -> int:
    if most:
        return MAX_NODE_SCORE if requested >= allocatable else requested * MAX_NODE_SCORE // allocatable
    if requested >= allocatable:
        return 0
    return (allocatable - requested) * MAX_NODE_SCORE // allocatable


__all__ = ["DEFAULT_RESOURCES", "LEAST_ALLOCATED", "MOST_ALLOCATED", "NodeResourcesFit", "TOO_MANY_PODS"]
