"""NodeName: a pod that names its node (spec.nodeName) fits only there."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpufleet.scheduler.framework import NODE_ADD, OK, SKIP, CycleState, Status
from gpufleet.scheduler.snapshot import NodeInfo, PodInfo, Snapshot

REASON = "node(s) didn't match the requested node name"


class NodeName:
    name = "NodeName"

    def __init__(self, args: Mapping[str, Any] | None = None, handle: Any = None) -> None:
        pass

    def pre_filter(self, state: CycleState, pod_info: PodInfo, snapshot: Snapshot) -> Status:
        return OK if pod_info.node_name else SKIP

    def filter(self, state: CycleState, pod_info: PodInfo, node_info: NodeInfo) -> Status:
        if not pod_info.node_name or pod_info.node_name == node_info.name:
            return OK
        return Status.unresolvable(REASON)

    def events_to_register(self) -> set[str]:
        return {NODE_ADD}
