"""Telling the user what the scheduler decided: the writes at the edge of a cycle.

A pod that fits nowhere gets a FailedScheduling Event, the condition
PodScheduled=False/Unschedulable (written only when it changed, on the resourceVersion it
was computed from) and the per-node breakdown in the gpufleet.io/scheduling-diagnosis
annotation, which a successful binding clears. A gang whose wait starts (or starts over
after its scheduleTimeoutSeconds) gets its PodGroup's ``status.scheduleStartTime``.
"""

from __future__ import annotations

import contextlib
import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from gpufleet.api import k8s
from gpufleet.api import podgroup as pg_api
from gpufleet.api.gpu import SCHEDULING_DIAGNOSIS_ANNOTATION
from gpufleet.client.errors import ApiError, Conflict, NotFound
from gpufleet.client.events import WARNING, EventRecorder
from gpufleet.scheduler.framework import FitError
from gpufleet.scheduler.snapshot import PodInfo
from gpufleet.utils.clock import Clock, rfc3339

log = logging.getLogger(__name__)

POD_SCHEDULED = "PodScheduled"
REASON_UNSCHEDULABLE = "Unschedulable"
REASON_SCHEDULING_GATED = "SchedulingGated"
GATED_MESSAGE = "Scheduling is blocked due to non-empty scheduling gates"
# Gang members whose last reported wait is remembered (a member bound or deleted is forgotten
# as newer ones push it out).
MAX_REMEMBERED_WAITS = 100_000
# Lines of the per-node breakdown kept on the pod; enough to see the pattern on a big cluster.
DIAGNOSIS_LINES = 20


def _pod(obj: Any) -> k8s.Pod:
    return obj if isinstance(obj, k8s.Pod) else k8s.Pod.model_validate(obj)


class Reporter:
    """``latest(pod_info)`` is the pod as the scheduler's informer has it now (or None)."""

    def __init__(
        self,
        client: Any,
        recorder: EventRecorder,
        *,
        clock: Clock,
        latest: Callable[[PodInfo], k8s.Pod | None],
    ) -> None:
        self.client = client
        self.recorder = recorder
        self.clock = clock
        self.latest = latest
        # Pod UID -> the kind of wait its last gang Event reported (oldest first, bounded).
        self._waits: OrderedDict[str, str] = OrderedDict()
        # Pod key -> the PodScheduled=False verdict waiting for its write; pods being written.
        self._pending_conditions: dict[str, tuple[PodInfo, str, str, str | None]] = {}
        self._condition_writers: set[str] = set()

    async def unschedulable(self, pod_info: PodInfo, error: FitError) -> None:
        message = error.message
        await self.recorder.record(pod_info.pod, WARNING, "FailedScheduling", message)
        # With no nodes at all there is nothing per node to add to the message.
        diagnosis = "\n".join(error.node_breakdown(DIAGNOSIS_LINES)) or None
        await self.set_pod_scheduled_false(pod_info, REASON_UNSCHEDULABLE, message, diagnosis)

    async def gang_member(self, pod_info: PodInfo, message: str, diagnosis: str | None,
                          wait: str | None = None) -> None:
        """A gang member sent back. ``wait`` names a kind of wait that every later arrival of
        the gang sends the member back into (a gang still missing members): its Event is
        recorded when the member starts that wait, not again on every arrival (a gang of n
        members arriving one by one would cost n(n-1)/2 Events); the PodScheduled condition
        carries the current message, and is not rewritten while it stays the same."""
        uid = pod_info.pod.metadata.uid if pod_info.pod.metadata is not None else None
        if wait is None or uid is None or self._waits.get(uid) != wait:
            await self.recorder.record(pod_info.pod, WARNING, "FailedScheduling", message)
        if uid is not None:
            self._remember_wait(uid, wait)
        await self.set_pod_scheduled_false(pod_info, REASON_UNSCHEDULABLE, message, diagnosis)

    def _remember_wait(self, uid: str, wait: str | None) -> None:
        self._waits.pop(uid, None)
        if wait is not None:
            self._waits[uid] = wait
            while len(self._waits) > MAX_REMEMBERED_WAITS:
                self._waits.popitem(last=False)

    async def gated(self, pod_info: PodInfo) -> None:
        await self.set_pod_scheduled_false(pod_info, REASON_SCHEDULING_GATED, GATED_MESSAGE)

    async def set_pod_scheduled_false(
        self, pod_info: PodInfo, reason: str, message: str, diagnosis: str | None = None
    ) -> None:
        """PodScheduled=False with this reason and message, written only when it changed.
        The writes of one pod are made one at a time and the latest verdict wins: verdicts
        that come while one is being written replace each other (a gang member is sent back
        on every arrival of another member; only the last message needs to land)."""
        key = pod_info.key
        self._pending_conditions[key] = (pod_info, reason, message, diagnosis)
        if key in self._condition_writers:
            return
        self._condition_writers.add(key)
        try:
            while key in self._pending_conditions:
                await self._write_pod_scheduled_false(*self._pending_conditions.pop(key))
        except BaseException:
            self._pending_conditions.pop(key, None)
            raise
        finally:
            self._condition_writers.discard(key)

    async def _write_pod_scheduled_false(
        self, pod_info: PodInfo, reason: str, message: str, diagnosis: str | None
    ) -> None:
        pod = self.latest(pod_info) or pod_info.pod
        conditions = (pod.status.conditions if pod.status else None) or []
        previous = next((c for c in conditions if c.type == POD_SCHEDULED), None)
        if previous is not None and (previous.status, previous.reason, previous.message) == (
            "False",
            reason,
            message,
        ):
            return
        condition: dict[str, Any] = {
            "type": POD_SCHEDULED,
            "status": "False",
            "reason": reason,
            "message": message,
        }
        if previous is None or previous.status != "False":
            condition["lastTransitionTime"] = rfc3339(self.clock.now())
        # The writes name the resourceVersion they were computed from: a gang member can be
        # bound while this verdict is in flight, and a stale "Unschedulable" must not land
        # on a pod that is already placed.
        rv = pod.metadata.resource_version if pod.metadata else None
        for _ in range(3):
            if pod.spec is not None and pod.spec.node_name:
                return
            try:
                meta = {"resourceVersion": rv} if rv else {}
                updated = await self.client.patch(
                    "pods",
                    pod_info.name,
                    {"metadata": meta, "status": {"conditions": [condition]}},
                    pod_info.namespace,
                    patch_type="strategic",
                    subresource="status",
                    raw=True,
                )
                if diagnosis is not None:
                    rv = (updated.get("metadata") or {}).get("resourceVersion") if isinstance(updated, dict) else None
                    meta = {"resourceVersion": rv} if rv else {}
                    await self.client.patch(
                        "pods",
                        pod_info.name,
                        {"metadata": {**meta, "annotations": {SCHEDULING_DIAGNOSIS_ANNOTATION: diagnosis}}},
                        pod_info.namespace,
                        patch_type="merge",
                        raw=True,
                    )
                return
            except Conflict:
                try:
                    pod = _pod(await self.client.get("pods", pod_info.name, pod_info.namespace, raw=True))
                except NotFound:
                    return
                except ApiError as exc:
                    log.warning("could not re-read %s: %s", pod_info.key, exc)
                    return
                rv = pod.metadata.resource_version if pod.metadata else None
            except NotFound:
                return
            except ApiError as exc:
                log.warning("could not update the PodScheduled condition of %s: %s", pod_info.key, exc)
                return

    async def clear_diagnosis(self, pod_info: PodInfo) -> None:
        pod = self.latest(pod_info) or pod_info.pod
        annotations = (pod.metadata.annotations if pod.metadata else None) or {}
        if SCHEDULING_DIAGNOSIS_ANNOTATION not in annotations:
            return
        with contextlib.suppress(ApiError):
            await self.client.patch(
                "pods",
                pod_info.name,
                {"metadata": {"annotations": {SCHEDULING_DIAGNOSIS_ANNOTATION: None}}},
                pod_info.namespace,
                patch_type="merge",
                raw=True,
            )

    async def gang_wait_started(self, group: str, wall: float) -> None:
        """The PodGroup's status.scheduleStartTime (the rest of its status is the PodGroup
        controller's)."""
        namespace, _, name = group.partition("/")
        try:
            await self.client.patch(
                pg_api.PodGroup, name, {"status": {"scheduleStartTime": rfc3339(wall)}}, namespace,
                subresource="status", raw=True,
            )
        except NotFound:
            pass
        except ApiError as exc:
            log.warning("could not update the status of pod group %s: %s", group, exc)
