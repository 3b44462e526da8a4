"""NodeUnschedulable: a cordoned node (spec.unschedulable) takes only pods that tolerate
the node.kubernetes.io/unschedulable:NoSchedule taint (daemons, drain helpers)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpufleet.api.taints import NO_SCHEDULE, tolerated
from gpufleet.scheduler.framework import NODE_ADD, NODE_TAINT, OK, Status
from gpufleet.scheduler.snapshot import NodeInfo, PodInfo

UNSCHEDULABLE_TAINT_KEY = "node.kubernetes.io/unschedulable"
REASON = "node(s) were unschedulable"


class NodeUnschedulable:
    name = "NodeUnschedulable"

    def __init__(self, args: Mapping[str, Any] | None = None, handle: Any = None) -> None:
        pass

    def filter(self, state: Any, pod_info: PodInfo, node_info: NodeInfo) -> Status:
        if not node_info.unschedulable:
            return OK
        if tolerated(pod_info.tolerations, UNSCHEDULABLE_TAINT_KEY, "", NO_SCHEDULE):
            return OK
        return Status.unresolvable(REASON)

    def filter_nodes(self, state: Any, pod_info: PodInfo, nodes: list[NodeInfo]) -> list[NodeInfo]:
        passed = [n for n in nodes if not n.unschedulable]
        if len(passed) == len(nodes) or tolerated(
            pod_info.tolerations, UNSCHEDULABLE_TAINT_KEY, "", NO_SCHEDULE
        ):
            return nodes
        return passed

    def events_to_register(self) -> set[str]:
        return {NODE_ADD, NODE_TAINT}
