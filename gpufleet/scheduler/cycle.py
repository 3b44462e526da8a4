"""What a scheduling cycle gives back (ScheduleResult, FitError with its Diagnosis,
SchedulingError), what plugins get besides their arguments (FrameworkHandle), and the pods
a Permit plugin holds back (WaitingPod)."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpufleet.scheduler.snapshot import NodeInfo, PodInfo, Snapshot
from gpufleet.scheduler.status import OK, Code, CycleState, Status
from gpufleet.utils.clock import REAL_CLOCK, Clock

if TYPE_CHECKING:
    from gpufleet.scheduler.framework import Framework


class ScheduleResult:
    """Where the pod goes and which GPUs it gets. ``scores`` (weighted total per scored node,
    empty when only one node was feasible) is built on first access: most callers never
    look at it, and a dict of a few hundred nodes per cycle is measurable."""

    __slots__ = ("node", "gpu_indices", "evaluated_nodes", "feasible_nodes", "state", "_scored", "_scores")

    def __init__(
        self,
        node: str,
        gpu_indices: tuple[int, ...] = (),
        scores: dict[str, int] | None = None,
        evaluated_nodes: int = 0,
        feasible_nodes: int = 0,
        state: CycleState | None = None,
        *,
        scored: tuple[list[NodeInfo], list[int]] | None = None,
    ) -> None:
        self.node = node
        self.gpu_indices = gpu_indices
        self.evaluated_nodes = evaluated_nodes
        self.feasible_nodes = feasible_nodes
        self.state = state if state is not None else CycleState()
        self._scored = scored
        self._scores = scores

    @property
    def scores(self) -> dict[str, int]:
        if self._scores is None:
            if self._scored is None:
                self._scores = {}
            else:
                nodes, totals = self._scored
                self._scores = {n.name: total for n, total in zip(nodes, totals, strict=True)}
        return self._scores

    def __repr__(self) -> str:
        return (
            f"ScheduleResult(node={self.node!r}, gpu_indices={self.gpu_indices}, "
            f"evaluated_nodes={self.evaluated_nodes}, feasible_nodes={self.feasible_nodes})"
        )


@dataclass
class Diagnosis:
    node_statuses: dict[str, Status] = field(default_factory=dict)
    pre_filter_msg: str = ""
    post_filter_msg: str = ""
    unschedulable_plugins: set[str] = field(default_factory=set)
    # Where a PostFilter plugin (preemption) made room for the pod, to try there first.
    nominated_node: str | None = None


class FitError(Exception):
    """No node can take the pod. ``str()`` is kube-scheduler's message, e.g.
    "0/3 nodes are available: 1 node(s) had untolerated taint {gpu: broken}, 2 Insufficient
    nvidia.com/gpu." (counts per reason, sorted as strings, like Kubernetes)."""

    def __init__(self, pod_info: PodInfo, num_all_nodes: int, diagnosis: Diagnosis) -> None:
        super().__init__(pod_info.key, num_all_nodes)
        self.pod_info = pod_info
        self.num_all_nodes = num_all_nodes
        self.diagnosis = diagnosis
        self._message: str | None = None

    @property
    def message(self) -> str:
        # Rendered on first use: counting the reasons of thousands of nodes is wasted on
        # a caller that only needs to know the pod did not fit.
        if self._message is None:
            self._message = self._render()
        return self._message

    def _render(self) -> str:
        if self.num_all_nodes == 0 and not self.diagnosis.pre_filter_msg:
            return "no nodes available to schedule pods"
        text = f"0/{self.num_all_nodes} nodes are available:"
        if self.diagnosis.pre_filter_msg:
            text += f" {self.diagnosis.pre_filter_msg}."
        else:
            counts = Counter(r for status in self.diagnosis.node_statuses.values() for r in status.reasons)
            histogram = sorted(f"{count} {reason}" for reason, count in counts.items())
            if histogram:
                text += f" {', '.join(histogram)}."
        if self.diagnosis.post_filter_msg:
            text += f" {self.diagnosis.post_filter_msg}."
        return text

    def node_breakdown(self, limit: int | None = None) -> list[str]:
        """One line per rejected node, in name order, such as
        'node-a: Insufficient nvidia.com/gpu (requested 4, free 2)'; with a limit, a last
        line says how many were left out."""
        items = sorted(self.diagnosis.node_statuses.items())
        lines = [f"{name}: {status.describe()}" for name, status in items[: limit if limit else None]]
        if limit and len(items) > limit:
            lines.append(f"... and {len(items) - limit} more node(s)")
        return lines

    def __str__(self) -> str:
        return self.message


class SchedulingError(Exception):
    """A plugin answered ERROR: the cycle is aborted and the pod retried after a back-off."""

    def __init__(self, status: Status) -> None:
        self.status = status
        super().__init__(f"{status.plugin or 'framework'}: {status.message}")


# -- plugin construction ----------------------------------------------------------------


@dataclass
class FrameworkHandle:
    """What plugins may use besides their arguments. ``client`` is None in pure use (tests,
    benchmarks): binding plugins then have nothing to do."""

    client: Any = None
    clock: Clock = REAL_CLOCK
    framework: Framework | None = None
    # The snapshot of the cycle in progress, for plugins that get a node by name (Reserve).
    snapshot: Snapshot | None = None
    # Pod (uid or key) -> the node preemption nominated it for, while its victims leave.
    nominated_nodes: dict[str, str] = field(default_factory=dict)
    # Pods ('namespace/name') preemption is deleting, not yet seen terminating.
    pending_victims: set[str] = field(default_factory=set)
    # The claims, volumes and classes as they are now (a volumes.StorageTracker), for the
    # binding steps that wait on them; cycles read the snapshot's copy instead.
    volumes: Any = None


PluginFactory = Callable[[Mapping[str, Any], FrameworkHandle], Any]
Registry = dict[str, PluginFactory]


class WaitingPod:
    """A pod that a Permit plugin holds back (gang scheduling): it binds once every waiting
    plugin allowed it, and is rejected at the first reject or when the shortest timeout ends."""

    def __init__(self, pod_info: PodInfo, node_name: str, timeouts: Mapping[str, float]) -> None:
        self.pod_info = pod_info
        self.node_name = node_name
        self.pending: dict[str, float] = dict(timeouts)
        self._result: Status | None = None
        self._future: asyncio.Future[Status] | None = None

    @property
    def decided(self) -> bool:
        return self._result is not None

    def allow(self, plugin: str) -> None:
        self.pending.pop(plugin, None)
        if not self.pending:
            self._decide(OK)

    def reject(self, plugin: str, message: str) -> None:
        self._decide(Status(Code.UNSCHEDULABLE, [message], plugin))

    def _decide(self, status: Status) -> None:
        if self._result is not None:
            return
        self._result = status
        if self._future is not None and not self._future.done():
            self._future.set_result(status)

    async def wait(self, clock: Clock) -> Status:
        if self._result is not None:
            return self._result
        self._future = asyncio.get_running_loop().create_future()
        plugin, timeout = min(self.pending.items(), key=lambda kv: kv[1])
        # Sleep on the injected clock so gang timeouts follow virtual time in replays.
        sleeper = asyncio.ensure_future(clock.sleep(timeout))
        try:
            await asyncio.wait({self._future, sleeper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not sleeper.done():
                sleeper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sleeper
        if self._result is None:
            self.reject(plugin, f"rejected due to timeout after waiting {timeout:g}s at plugin {plugin}")
        assert self._result is not None
        return self._result
