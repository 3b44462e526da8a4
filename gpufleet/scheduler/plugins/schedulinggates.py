"""SchedulingGates: a pod with spec.schedulingGates waits outside the active queue until
whoever owns the gates removes them (a queue admission controller, say)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpufleet.scheduler.framework import OK, Code, Status
from gpufleet.scheduler.snapshot import PodInfo

REASON = "SchedulingGated"


class SchedulingGates:
    name = "SchedulingGates"

    def __init__(self, args: Mapping[str, Any] | None = None, handle: Any = None) -> None:
        pass

    def pre_enqueue(self, pod_info: PodInfo) -> Status:
        spec = pod_info.pod.spec
        gates = spec.scheduling_gates if spec is not None else None
        if not gates:
            return OK
        names = ", ".join(g.name for g in gates)
        return Status(Code.UNSCHEDULABLE_AND_UNRESOLVABLE, [f"waiting for scheduling gates: [{names}]"])

    def events_to_register(self) -> set[str]:
        # Only an update of the pod itself lifts a gate, and the queue handles those.
        return set()
