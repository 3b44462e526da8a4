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
from gpufleet.scheduler.gpu import GPU_RESOURCE
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

    def _ignored(self, resource: str) -> bool:
        return resource in self.ignored or resource.partition("/")[0] in self.ignored_groups

    # -- filter ---------------------------------------------------------------------------

    def filter(self, state: CycleState, pod_info: PodInfo, node_info: NodeInfo) -> Status:
        short: list[tuple[str, int, int, int]] | None = None
        alloc_pods = node_info.alloc_pods
        if alloc_pods is not None and len(node_info.pods) >= alloc_pods:
            short = [(PODS, 1, alloc_pods - len(node_info.pods), alloc_pods)]
        cpu = pod_info.cpu
        if cpu and cpu > node_info.alloc_cpu - node_info.req_cpu:
            short = short or []
            short.append((CPU, cpu, node_info.alloc_cpu - node_info.req_cpu, node_info.alloc_cpu))
        memory = pod_info.memory
        if memory and memory > node_info.alloc_memory - node_info.req_memory:
            short = short or []
            short.append(
                (MEMORY, memory, node_info.alloc_memory - node_info.req_memory, node_info.alloc_memory)
            )
        gpus = pod_info.gpus
        if gpus and gpus > node_info.alloc_gpus - node_info.req_gpus:
            short = short or []
            short.append(
                (GPU_RESOURCE, gpus, node_info.alloc_gpus - node_info.req_gpus, node_info.alloc_gpus)
            )
        if pod_info.scalar:
            alloc, req = node_info.alloc_scalar, node_info.req_scalar
            for resource, amount in pod_info.scalar.items():
                free = alloc.get(resource, 0) - req.get(resource, 0)
                if amount > free and not self._ignored(resource):
                    short = short or []
                    short.append((resource, amount, free, alloc.get(resource, 0)))
        if short is None:
            return OK
        return self._rejection(short)

    def _rejection(self, short: list[tuple[str, int, int, int]]) -> Status:
        reasons, details = [], []
        # Unresolvable when even an empty node would not do: evicting pods cannot help.
        unresolvable = True
        for resource, requested, free, allocatable in short:
            if resource == PODS:
                reasons.append(TOO_MANY_PODS)
                details.append(f"{TOO_MANY_PODS} (limit {allocatable})")
                unresolvable = unresolvable and allocatable == 0
                continue
            reasons.append(insufficient_reason(resource))
            details.append(
                f"{insufficient_reason(resource)} (requested {_format(resource, requested)}, "
                f"free {_format(resource, max(free, 0))})"
            )
            unresolvable = unresolvable and requested > allocatable
        code = Code.UNSCHEDULABLE_AND_UNRESOLVABLE if unresolvable else Code.UNSCHEDULABLE
        return Status(code, reasons, detail=", ".join(details))

    # -- score ----------------------------------------------------------------------------

    def score(self, state: CycleState, pod_info: PodInfo, node_info: NodeInfo) -> int:
        return self.score_nodes(state, pod_info, [node_info])[0]

    def score_nodes(self, state: CycleState, pod_info: PodInfo, nodes: list[NodeInfo]) -> list[int]:
        most = self.strategy == MOST_ALLOCATED
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
        pod_cpu, pod_mem, pod_gpus = pod_info.nonzero_cpu, pod_info.nonzero_memory, pod_info.gpus
        out = []
        for n in nodes:
            total = weights = 0
            if cpu_w and n.alloc_cpu:
                total += cpu_w * _ratio(n.nonzero_cpu + pod_cpu, n.alloc_cpu, most)
                weights += cpu_w
            if mem_w and n.alloc_memory:
                total += mem_w * _ratio(n.nonzero_memory + pod_mem, n.alloc_memory, most)
                weights += mem_w
            if gpu_w and n.alloc_gpus:
                total += gpu_w * _ratio(n.req_gpus + pod_gpus, n.alloc_gpus, most)
                weights += gpu_w
            for resource, weight, amount in scalars:
                alloc = n.alloc_scalar.get(resource, 0)
                if alloc:
                    total += weight * _ratio(n.req_scalar.get(resource, 0) + amount, alloc, most)
                    weights += weight
            out.append(total // weights if weights else 0)
        return out

    def events_to_register(self) -> set[str]:
        return {NODE_ADD, NODE_ALLOCATABLE, POD_DELETE, POD_UPDATE}


def _ratio(requested: int, allocatable: int, most: bool) -> int:
    if most:
        return MAX_NODE_SCORE if requested >= allocatable else requested * MAX_NODE_SCORE // allocatable
    if requested >= allocatable:
        return 0
    return (allocatable - requested) * MAX_NODE_SCORE // allocatable


__all__ = ["DEFAULT_RESOURCES", "LEAST_ALLOCATED", "MOST_ALLOCATED", "NodeResourcesFit", "TOO_MANY_PODS"]
