"""TaintToleration: NoSchedule and NoExecute taints keep off pods that do not tolerate them;
PreferNoSchedule taints only lower a node's score."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpufleet.api.taints import NO_EXECUTE, NO_SCHEDULE, PREFER_NO_SCHEDULE, tolerated
from gpufleet.scheduler.framework import NODE_ADD, NODE_TAINT, OK, SKIP, CycleState, Status
from gpufleet.scheduler.plugins.helpers import default_normalize_score
from gpufleet.scheduler.snapshot import NodeInfo, PodInfo

_PREFERENCE_KEY = "TaintToleration/prefer-no-schedule-tolerations"


def untolerated_taint_reason(key: str, value: str) -> str:
    return f"node(s) had untolerated taint {{{key}: {value}}}"


class TaintToleration:
    name = "TaintToleration"

    def __init__(self, args: Mapping[str, Any] | None = None, handle: Any = None) -> None:
        pass

    def filter(self, state: CycleState, pod_info: PodInfo, node_info: NodeInfo) -> Status:
        taints = node_info.taints
        if not taints:
            return OK
        tolerations = pod_info.tolerations
        for key, value, effect in taints:
            if effect != NO_SCHEDULE and effect != NO_EXECUTE:
                continue
            if not tolerated(tolerations, key, value, effect):
                return Status.unresolvable(untolerated_taint_reason(key, value))
        return OK

    def filter_nodes(self, state: CycleState, pod_info: PodInfo, nodes: list[NodeInfo]) -> list[NodeInfo]:
        return [n for n in nodes if not n.taints or not self.filter(state, pod_info, n).code]

    def pre_score(self, state: CycleState, pod_info: PodInfo, nodes: list[NodeInfo]) -> Status:
        if not any([n.soft_taints for n in nodes]):
            return SKIP
        # Only tolerations that can apply to PreferNoSchedule count for the score.
        relevant = tuple(t for t in pod_info.tolerations if t[3] in ("", PREFER_NO_SCHEDULE))
        state.write(_PREFERENCE_KEY, relevant)
        return OK

    def score(self, state: CycleState, pod_info: PodInfo, node_info: NodeInfo) -> int:
        tolerations = state.read(_PREFERENCE_KEY, pod_info.tolerations)
        return sum(
            1
            for key, value, effect in node_info.soft_taints
            if not tolerated(tolerations, key, value, effect)
        )

    def normalize_score(self, state: CycleState, pod_info: PodInfo, scores: list[int]) -> None:
        # Raw scores count intolerable taints: fewer is better.
        default_normalize_score(scores, reverse=True)

    def events_to_register(self) -> set[str]:
        return {NODE_ADD, NODE_TAINT}
