"""The gang cycle of the scheduler: one cycle places every pending member of a PodGroup, or
none (see gang.py for the placement itself, on the snapshot).

Popping one member takes the other pending members of its group out of the queue. Fewer
than ``minMember`` members in all: every one goes back to the queue waiting for the rest
(only the group's own changes wake them). At least ``minMember`` fit: they are all assumed
and bound. Otherwise nothing is held; preemption is tried for the whole gang, and every
member goes back to the queue with the same reason. A gang that keeps failing is told so
on its PodGroup after ``scheduleTimeoutSeconds`` and retried (gang.GangState keeps the
waits).

``GangCycles`` is a part of ``Scheduler`` (scheduler.py), kept here so that the loop and
the binding cycle read on their own; it uses the scheduler's queue, cache, framework and
snapshot, and the collaborators named below.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from gpufleet.api import podgroup as pg_api
from gpufleet.api import volcano as vc_api
from gpufleet.client import objects
from gpufleet.client.events import WARNING, EventRecorder
from gpufleet.scheduler.cache import SchedulerCache
from gpufleet.scheduler.framework import Code, Framework, ScheduleResult, SchedulingError
from gpufleet.scheduler.gang import GangPlacement, GangState, place_gang, plan_gang_preemption
from gpufleet.scheduler.preemptor import Preemptor
from gpufleet.scheduler.profile import Profile
from gpufleet.scheduler.queue import QueuedPodInfo, SchedulingQueue
from gpufleet.scheduler.reporting import DIAGNOSIS_LINES, Reporter
from gpufleet.scheduler.snapshot import PodInfo, Snapshot
from gpufleet.utils.clock import Clock

# The scheduler's own logger: these cycles are its.
log = logging.getLogger("gpufleet.scheduler.scheduler")

# What gang members wait for besides resources (a missing member or PodGroup): only the
# group's own changes wake them, not cluster events.
COSCHEDULING = "Coscheduling"


def _model(cls: Any, obj: Any) -> Any:
    return obj if isinstance(obj, cls) else cls.model_validate(obj)


class GangCycles:
    # Provided by Scheduler.
    clock: Clock
    profile: Profile
    framework: Framework
    cache: SchedulerCache
    queue: SchedulingQueue
    recorder: EventRecorder
    stats: Counter[str]
    gangs: GangState
    preemptor: Preemptor
    reporter: Reporter
    _snapshot: Snapshot
    _podgroup_informer: Any
    _volcano_podgroup_informer: Any

    if TYPE_CHECKING:
        def _skip(self, pod_info: PodInfo) -> bool: ...
        def _refresh_snapshot(self, pod_info: PodInfo, own_group: str = "") -> None: ...
        def _observe(self, result: str, start: float, profile: str) -> None: ...
        def _spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> Any: ...
        def _spawn_binding(self, qpi: QueuedPodInfo, assumed: PodInfo, result: ScheduleResult) -> None: ...
        def _forget_nomination(self, key: str) -> None: ...

    def _podgroup(self, group: str) -> pg_api.PodGroup | None:
        return self._gang(group)[0]

    def _gang(self, group: str) -> tuple[pg_api.PodGroup | None, str | None]:
        """The group's PodGroup (scheduling.x-k8s.io, else Volcano's seen as one) and why it
        is held back regardless of resources (None: it is not)."""
        obj = self._podgroup_informer.get(group) if self._podgroup_informer is not None else None
        if obj is not None:
            return _model(pg_api.PodGroup, obj), None
        obj = self._volcano_podgroup_informer.get(group) if self._volcano_podgroup_informer is not None else None
        if obj is not None:
            return vc_api.gang_view(_model(vc_api.VolcanoPodGroup, obj))
        return None, None

    def _on_volcano_podgroup_update(self, old: Any, new: Any) -> None:
        # Its Queue admitting it (Pending -> Inqueue, a status write) is what its gang waits for.
        before = _model(vc_api.VolcanoPodGroup, old) if old is not None else None
        after = _model(vc_api.VolcanoPodGroup, new)
        if before is not None and before.spec == after.spec and vc_api.gang_view(before)[1] == vc_api.gang_view(
                after)[1]:
            return
        self._on_podgroup(after)

    def _on_podgroup(self, obj: Any) -> None:
        # Either kind of PodGroup (typed or not): only its key matters here.
        self._wake_group(objects.object_key(obj))

    def _on_podgroup_update(self, old: Any, new: Any) -> None:
        before = _model(pg_api.PodGroup, old) if old is not None else None
        after = _model(pg_api.PodGroup, new)
        if before is not None and before.spec == after.spec:
            return  # a status write: nothing for the gang to retry on
        self._on_podgroup(after)

    def _on_podgroup_delete(self, obj: Any) -> None:
        self.gangs.forget(objects.object_key(obj))

    def _wake_group(self, group: str) -> None:
        members = self.gangs.members(group)
        self.queue.activate(PodInfo(p) for key, p in members.items() if self.queue.get(key) is not None)

    def _bound_members(self, group: str) -> list[PodInfo]:
        out = []
        for pod in self.gangs.members(group).values():
            placed = self.cache.get_pod(pod)
            if placed is not None and not placed.terminal:
                out.append(placed)
        return out

    def _take_gang(self, qpi: QueuedPodInfo) -> list[QueuedPodInfo]:
        """The popped member and every other pending member of its group, out of the queue."""
        gang = [qpi]
        for key in list(self.gangs.members(qpi.pod_info.pod_group)):
            if key == qpi.key:
                continue
            sibling = self.queue.take(key)
            if sibling is None:
                continue
            if self._skip(sibling.pod_info):
                continue
            gang.append(sibling)
        return gang

    def schedule_gang(self, qpi: QueuedPodInfo) -> GangPlacement | None:
        """One cycle for a whole gang: every pending member placed on the snapshot, then
        all of them assumed and bound if at least minMember fit, else none (nothing is
        held while the gang waits) and the gang goes back to the queue together."""
        group = qpi.pod_info.pod_group
        cycle = self.queue.scheduling_cycle
        profile = self.profile.scheduler_name
        start = self.clock.monotonic()
        gang = self._take_gang(qpi)
        pg, hold = self._gang(group)
        if pg is None or hold is not None:
            self._reject_gang(gang, hold or f"pod group {group} not found", {COSCHEDULING}, cycle)
            self._observe("unschedulable", start, profile)
            return None
        min_member = pg_api.min_member(pg)
        bound = self._bound_members(group)
        existing = len(gang) + len(bound)
        if existing < min_member:
            timeout = pg_api.schedule_timeout(pg)
            self._gang_unsuccessful(group, pg, f"{existing} of minMember {min_member} members exist")
            message = (
                f"pod group {group}: fewer than minMember {min_member} members exist; waiting for the "
                f"rest (scheduleTimeoutSeconds {timeout})"
            )
            self._reject_gang(gang, message, {COSCHEDULING}, cycle, wait=f"members-missing:{group}")
            self._observe("unschedulable", start, profile)
            return None
        self._refresh_snapshot(qpi.pod_info, own_group=group)
        by_key = {q.key: q for q in gang}
        try:
            placement = place_gang(
                self.framework,
                self._snapshot,
                group,
                [q.pod_info for q in gang],
                min_member=min_member,
                bound=bound,
            )
        except SchedulingError as exc:
            log.error("scheduling pod group %s: %s", group, exc)
            self._observe("error", start, profile)
            for q in gang:
                q.unschedulable_plugins = set()
                self.queue.add_unschedulable_if_not_present(q, cycle)
            return None
        if placement.ok:
            self.gangs.placed(group)
            for member, result in placement.placed:
                member_qpi = by_key[member.uid or member.key]
                self._forget_nomination(member_qpi.key)
                assumed = self.cache.assume_pod(member, result.node, result.gpu_indices)
                permit = self.framework.run_permit(result.state, member, result.node)
                if permit.code not in (Code.SUCCESS, Code.WAIT):
                    self.cache.forget_pod(assumed)
                    self.framework.run_unreserve(result.state, member, result.node)
                    member_qpi.unschedulable_plugins = {permit.plugin} if permit.is_rejected else set()
                    self.queue.add_unschedulable_if_not_present(member_qpi, cycle)
                    continue
                self._observe("scheduled", start, profile)
                self._spawn_binding(member_qpi, assumed, result)
            for member, error in placement.failed:
                member_qpi = by_key[member.uid or member.key]
                member_qpi.unschedulable_plugins = set(error.diagnosis.unschedulable_plugins)
                self.queue.add_unschedulable_if_not_present(member_qpi, cycle)
                self._spawn(self.reporter.unschedulable(member, error), f"report:{member.key}")
            return placement
        # Nothing of the gang stays on the snapshot. Would evicting lower-priority pods let
        # it fit whole?
        self._observe("unschedulable", start, profile)
        try:
            preemption = plan_gang_preemption(
                self.framework, self._snapshot, [q.pod_info for q in gang], min_member=min_member, bound=bound
            )
        except SchedulingError as exc:
            log.error("preemption for pod group %s: %s", group, exc)
            preemption = None
        if preemption is not None:
            preemptors = [(q.pod_info, preemption.nodes[q.key]) for q in gang if q.key in preemption.nodes]
            self.stats["preemptions"] += 1
            self.preemptor.start(preemptors, preemption.victims, group)
        self._gang_unsuccessful(group, pg, f"{placement.fits} of {placement.total} members fit")
        plugins: set[str] = set()
        for _, error in placement.failed:
            plugins |= error.diagnosis.unschedulable_plugins
        diagnosis = None
        if placement.failed:
            diagnosis = "\n".join(placement.failed[0][1].node_breakdown(DIAGNOSIS_LINES)) or None
        self._reject_gang(gang, placement.message(), plugins or {COSCHEDULING}, cycle, diagnosis)
        return placement

    def _reject_gang(
        self,
        gang: list[QueuedPodInfo],
        message: str,
        plugins: set[str],
        cycle: int,
        diagnosis: str | None = None,
        wait: str | None = None,
    ) -> None:
        """Every member back to the queue, waiting on the same events, with the same reason
        (``wait``: see Reporter.gang_member)."""
        for q in gang:
            q.unschedulable_plugins = set(plugins)
            self.queue.add_unschedulable_if_not_present(q, cycle)
            self._spawn(self.reporter.gang_member(q.pod_info, message, diagnosis, wait), f"report:{q.pod_info.key}")

    def _gang_unsuccessful(self, group: str, pg: pg_api.PodGroup, why: str) -> None:
        """Start (or check) the group's schedule timeout; past it, say so and start over."""
        timeout = pg_api.schedule_timeout(pg)
        wait = self.gangs.unsuccessful(group, timeout, self.clock.monotonic(), self.clock.now())
        if wait.started is not None:
            self._spawn(self.reporter.gang_wait_started(group, wait.started), f"podgroup:{group}")
        if not wait.timed_out:
            return
        self.stats["gang_timeouts"] += 1
        self._spawn(
            self.recorder.record(
                pg,
                WARNING,
                "ScheduleTimeout",
                f"pod group {group} was not placed within scheduleTimeoutSeconds {timeout}: {why}; retrying",
            ),
            f"timeout:{group}",
        )

    def _check_gang_timeouts(self) -> None:
        """Gangs waiting past their timeout get a cycle (which reports it), even if nothing
        else happened."""
        def timeout_of(group: str) -> float | None:
            pg = self._podgroup(group)
            return pg_api.schedule_timeout(pg) if pg is not None else None

        for group in self.gangs.overdue(self.clock.monotonic(), timeout_of):
            self._wake_group(group)
