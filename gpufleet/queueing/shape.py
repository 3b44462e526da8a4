"""The shape check: whether every pod of a workload fits, all at once, on nodes of its flavor
(its GPUs on one node, or in one interconnect group when the pod asks for that), given the
GPUs free per node and group."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpufleet.api.gpu import GPU_RESOURCE
from gpufleet.api.taints import tolerates_all
from gpufleet.queueing.workloads import NodeInfo, Placement, Toleration

FreeState = dict[str, dict[str, int]]  # node -> interconnect group -> free GPUs


@dataclass(frozen=True)
class PodDemand:
    pod_set: str
    gpus: int
    selector: Mapping[str, str]
    same_group: bool
    tolerations: tuple[Toleration, ...] = ()


@dataclass(frozen=True)
class ShapeMiss:
    pod_set: str
    gpus: int
    unplaced: int
    same_group: bool
    eligible_free: tuple[int, ...]  # free GPUs on each matching node, before placing


def merge_selectors(*selectors: Mapping[str, str]) -> dict[str, str] | None:
    """The union of label requirements; None when two of them want different values."""
    out: dict[str, str] = {}
    for sel in selectors:
        for k, v in sel.items():
            if out.get(k, v) != v:
                return None
            out[k] = v
    return out


def _matches(labels: Mapping[str, str], selector: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def _allowed(node: NodeInfo, tolerations: tuple[Toleration, ...]) -> bool:
    return tolerates_all(node.taints, tolerations)


def _room(groups: Mapping[str, int], same_group: bool) -> int:
    if not groups:
        return 0
    return max(groups.values()) if same_group else sum(groups.values())


def _take(groups: dict[str, int], gpus: int, same_group: bool) -> dict[str, int]:
    if same_group:
        # The tightest group that holds them all keeps the big groups whole.
        best = min((g for g, n in groups.items() if n >= gpus), key=lambda g: (groups[g], g))
        groups[best] -= gpus
        return {best: gpus}
    taken: dict[str, int] = {}
    left = gpus
    for g in sorted(groups, key=lambda g: (-groups[g], g)):
        if left == 0:
            break
        n = min(groups[g], left)
        if n:
            groups[g] -= n
            taken[g] = n
            left -= n
    return taken


def place(demands: Iterable[PodDemand], free: FreeState, nodes: Mapping[str, NodeInfo],
          taken: list[Placement] | None = None) -> ShapeMiss | None:
    """Place pods on nodes, biggest first, each on the node where it fits tightest
    (best-fit decreasing); ``free`` is updated and, when given, ``taken`` says where each pod
    went. Returns the first pod set that does not fit."""
    pending = sorted((d for d in demands if d.gpus > 0), key=lambda d: -d.gpus)
    missed: dict[tuple, list[PodDemand]] = {}
    before: dict[tuple, tuple[int, ...]] = {}
    for d in pending:
        sel_key = (d.pod_set, d.gpus, d.same_group, tuple(sorted(d.selector.items())), d.tolerations)
        eligible = [n for n in nodes.values()
                    if n.name in free and _matches(n.labels, d.selector) and _allowed(n, d.tolerations)]
        if sel_key not in before:
            before[sel_key] = tuple(sorted((_room(free[n.name], d.same_group) for n in eligible), reverse=True))
        fitting = [n for n in eligible if _room(free[n.name], d.same_group) >= d.gpus]
        if not fitting:
            missed.setdefault(sel_key, []).append(d)
            continue
        node = min(fitting, key=lambda n: (_room(free[n.name], d.same_group), n.name))
        groups = _take(free[node.name], d.gpus, d.same_group)
        if taken is not None:
            taken.append(Placement(node.name, groups))
    if not missed:
        return None
    key, ds = next(iter(missed.items()))
    return ShapeMiss(ds[0].pod_set, ds[0].gpus, len(ds), ds[0].same_group, before[key])


def shape_message(miss: ShapeMiss, flavor: str) -> str:
    where = "one interconnect group of one node" if miss.same_group else "one node"
    free = "+".join(str(n) for n in miss.eligible_free if n) or "0"
    largest = max(miss.eligible_free, default=0)
    return (f"pod set {miss.pod_set}: {miss.unplaced} pod(s) of {miss.gpus} {GPU_RESOURCE} each must fit on {where}; "
            f"free {GPU_RESOURCE} on the {len(miss.eligible_free)} node(s) of flavor {flavor}: {free} "
            f"(at most {largest} together)")
