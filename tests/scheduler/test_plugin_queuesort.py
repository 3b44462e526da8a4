"""PrioritySort and SchedulingGates."""

from __future__ import annotations

from sched_factories import pod_info

from gpufleet.scheduler.framework import Code
from gpufleet.scheduler.plugins.queuesort import PrioritySort
from gpufleet.scheduler.plugins.schedulinggates import SchedulingGates
from gpufleet.scheduler.queue import QueuedPodInfo


def queued(priority: int | None, created: float) -> QueuedPodInfo:
    return QueuedPodInfo(pod_info("p", priority=priority), timestamp=0.0, sort_timestamp=created)


def test_higher_priority_first_then_older():
    less = PrioritySort().less
    assert less(queued(10, 5.0), queued(0, 1.0))
    assert not less(queued(0, 1.0), queued(10, 5.0))
    assert less(queued(None, 1.0), queued(None, 2.0))
    assert not less(queued(None, 2.0), queued(None, 1.0))


def test_scheduling_gates_hold_pods_back():
    gates = SchedulingGates()
    assert gates.pre_enqueue(pod_info("p")).is_success
    status = gates.pre_enqueue(pod_info("p", scheduling_gates=["quota", "data"]))
    assert status.code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE
    assert status.message == "waiting for scheduling gates: [quota, data]"
