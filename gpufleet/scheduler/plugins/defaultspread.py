"""DefaultSpread: Kubernetes' default pod topology spreading, soft, for the replicas of a
ReplicaSet, StatefulSet or ReplicationController.

The default profile bin-packs, which on its own stacks every replica of a service on one
node, so that node's failure takes the whole service down. This plugin ranks a node higher
the fewer pods of the same controller it (and its zone, where nodes carry
topology.kubernetes.io/zone) already runs. Pods without such an owner are left alone: the
plugin skips them, and they bin-pack exactly as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpufleet.api.gpu import ZONE_LABEL
from gpufleet.scheduler.framework import MAX_NODE_SCORE, OK, SKIP, CycleState, Status
from gpufleet.scheduler.snapshot import NodeInfo, PodInfo

_STATE_KEY = "DefaultSpread/counts"

# As kube-scheduler's selector spreading: where zones are known they count for two thirds,
# the node itself for one third, so a zone going down costs as few replicas as possible
# while replicas still avoid sharing a node inside a zone.
ZONE_WEIGHT_NUM = 2
ZONE_WEIGHT_DEN = 3


class _Counts:
    __slots__ = ("owner", "max_node", "zone", "max_zone")

    def __init__(self, owner: str, max_node: int, zone: dict[str, int], max_zone: int) -> None:
        self.owner = owner
        self.max_node = max_node
        self.zone = zone
        self.max_zone = max_zone


class DefaultSpread:
    name = "DefaultSpread"

    def __init__(self, args: Mapping[str, Any] | None = None, handle: Any = None) -> None:
        self.handle = handle

    def pre_score(self, state: CycleState, pod_info: PodInfo, nodes: list[NodeInfo]) -> Status:
        owner = pod_info.spread_owner
        if not owner:
            return SKIP
        max_node = 0
        zones: set[str] = set()
        for n in nodes:
            count = n.owner_pods.get(owner, 0)
            if count > max_node:
                max_node = count
            zone = n.labels.get(ZONE_LABEL)
            if zone:
                zones.add(zone)
        zone_counts: dict[str, int] = {}
        if zones:
            # A zone's count covers all its nodes, not just the ones this cycle sampled.
            snapshot = getattr(self.handle, "snapshot", None)
            everywhere = snapshot.node_infos if snapshot is not None else nodes
            zone_counts = dict.fromkeys(zones, 0)
            for n in everywhere:
                count = n.owner_pods.get(owner)
                if count:
                    zone = n.labels.get(ZONE_LABEL)
                    if zone in zone_counts:
                        zone_counts[zone] += count
        max_zone = max(zone_counts.values(), default=0)
        if max_node == 0 and max_zone == 0:
            # No replica of this owner near any candidate: every node ranks the same.
            return SKIP
        state.write(_STATE_KEY, _Counts(owner, max_node, zone_counts, max_zone))
        return OK

    def _score(self, counts: _Counts, node_info: NodeInfo) -> int:
        owner = counts.owner
        max_node = counts.max_node
        node_score = (
            MAX_NODE_SCORE * (max_node - node_info.owner_pods.get(owner, 0)) // max_node
            if max_node
            else MAX_NODE_SCORE
        )
        zone = node_info.labels.get(ZONE_LABEL) if counts.zone else None
        if not zone:
            return node_score
        max_zone = counts.max_zone
        zone_score = (
            MAX_NODE_SCORE * (max_zone - counts.zone.get(zone, 0)) // max_zone if max_zone else MAX_NODE_SCORE
        )
        return (
            node_score * (ZONE_WEIGHT_DEN - ZONE_WEIGHT_NUM) + zone_score * ZONE_WEIGHT_NUM
        ) // ZONE_WEIGHT_DEN

    def score(self, state: CycleState, pod_info: PodInfo, node_info: NodeInfo) -> int:
        counts = state.read(_STATE_KEY)
        if counts is None:
            return MAX_NODE_SCORE
        return self._score(counts, node_info)

    def score_nodes(self, state: CycleState, pod_info: PodInfo, nodes: list[NodeInfo]) -> list[int]:
        counts = state.read(_STATE_KEY)
        if counts is None:
            return [MAX_NODE_SCORE] * len(nodes)
        return [self._score(counts, n) for n in nodes]

    def events_to_register(self) -> set[str]:
        # Scoring never rejects a pod, so no event can lift a rejection of this plugin's.
        return set()
