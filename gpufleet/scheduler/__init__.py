"""The GPU-aware scheduler: a kube-scheduler-style framework, its plugins, and the loop.

Pure parts (no I/O): framework (extension points, Status, FitError), snapshot (PodInfo,
NodeInfo, Snapshot), cache (SchedulerCache), queue (SchedulingQueue), plugins, gang (whole
PodGroups on a snapshot) and preemption (DefaultPreemption). The loop that connects them
to the API is scheduler.Scheduler.
"""

from gpufleet.scheduler.cache import SchedulerCache
from gpufleet.scheduler.framework import (
    Code,
    CycleState,
    FitError,
    Framework,
    FrameworkHandle,
    ScheduleResult,
    SchedulingError,
    Status,
)
from gpufleet.scheduler.profile import LEAST_ALLOCATED, MOST_ALLOCATED, Profile
from gpufleet.scheduler.queue import QueuedPodInfo, SchedulingQueue
from gpufleet.scheduler.scheduler import Scheduler
from gpufleet.scheduler.snapshot import NodeInfo, PodInfo, Snapshot

__all__ = [
    "LEAST_ALLOCATED",
    "MOST_ALLOCATED",
    "Code",
    "CycleState",
    "FitError",
    "Framework",
    "FrameworkHandle",
    "NodeInfo",
    "PodInfo",
    "Profile",
    "QueuedPodInfo",
    "ScheduleResult",
    "Scheduler",
    "SchedulerCache",
    "SchedulingError",
    "SchedulingQueue",
    "Snapshot",
    "Status",
]
