"""PodGroup status: the phase of a gang and the counts of its members, as scheduler-plugins'
PodGroup controller keeps them.

The members of ``<namespace>/<name>`` are the pods of that namespace labelled
``scheduling.x-k8s.io/pod-group: <name>``, in every phase. From them (``decide``, pure):
``scheduled`` (bound to a node), ``running``, ``succeeded``, ``failed``, ``occupiedBy``
(the workload the members belong to) and the phase (``podgroup_phase``). Only what
changed is written, through the status subresource.

``status.scheduleStartTime`` is not this controller's: the scheduler writes it when a gang
cycle first fails (and again when the gang's scheduleTimeoutSeconds runs out), since only
the scheduler sees its cycles. A merge patch of the other fields leaves it as it is.

``decide_podgroup`` gives that patch as Actions, applied with ``actions.apply``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpufleet.api import k8s
from gpufleet.api import podgroup as pg_api
from gpufleet.client.api import Client
from gpufleet.client.controller import Requeue
from gpufleet.client.errors import NotFound
from gpufleet.client.informer import SharedInformerFactory
from gpufleet.controllers.actions import Actions, Patch
from gpufleet.controllers.base import KeyedController

# Pods by the PodGroup they are members of ('namespace/name').
POD_GROUP_INDEX = "podGroup"
_COUNTS = ("scheduled", "running", "succeeded", "failed")


def podgroup_phase(min_member: int, members: int, scheduled: int, running: int, succeeded: int, failed: int,
                   previous: str | None = None) -> str:
    """A PodGroup's phase from the counts of its members, as scheduler-plugins' PodGroup
    controller moves it, plus the end of a gang whose members do not all stay around.

    Once every member still there has ended, the group has ended: Failed if one of them
    failed, Finished otherwise. That holds when fewer than minMember are left to count (a
    training job's operator deletes the workers once the master succeeded), and the group
    keeps that phase when its last members are deleted; members that are not done (a new
    attempt of the same gang) put it back on its way from Pending.
    """
    ended = succeeded + failed
    active = members - ended
    if succeeded >= min_member and running == 0:
        return pg_api.FINISHED
    if failed and failed + running + succeeded >= min_member:
        return pg_api.FAILED
    if members and active == 0:
        return pg_api.FAILED if failed else pg_api.FINISHED
    if members == 0 and previous in (pg_api.FINISHED, pg_api.FAILED):
        return previous
    if running + succeeded >= min_member:
        return pg_api.RUNNING
    if scheduled >= min_member:
        return pg_api.SCHEDULED
    if scheduled:
        return pg_api.SCHEDULING
    if members >= min_member:
        return pg_api.PRE_SCHEDULING
    return pg_api.PENDING


def occupied_by(pod: k8s.Pod) -> str:
    """scheduler-plugins' ``status.occupiedBy``: the workload the group's pods belong to, as
    ``<namespace>/<owner name>`` for each owner of a member (sorted, comma-separated)."""
    meta = pod.metadata or k8s.ObjectMeta()
    return ",".join(sorted(f"{meta.namespace}/{r.name}" for r in meta.owner_references or ()))


def podgroup_status(pg: pg_api.PodGroup, members: Sequence[k8s.Pod]) -> dict[str, Any]:
    """What status the PodGroup should have (less scheduleStartTime) from its members."""
    min_member = pg_api.min_member(pg)
    scheduled = running = succeeded = failed = 0
    occupied = ""
    for pod in members:
        phase = pod.status.phase if pod.status is not None else None
        if pod.spec is not None and pod.spec.node_name:
            scheduled += 1
        if phase == "Running":
            running += 1
        elif phase == "Succeeded":
            succeeded += 1
        elif phase == "Failed":
            failed += 1
        if not occupied:
            occupied = occupied_by(pod)
    previous = pg.status.phase if pg.status is not None else None
    phase = podgroup_phase(min_member, len(members), scheduled, running, succeeded, failed, previous)
    status: dict[str, Any] = {
        "phase": phase,
        "scheduled": scheduled,
        "running": running,
        "succeeded": succeeded,
        "failed": failed,
    }
    if occupied:
        status["occupiedBy"] = occupied
    if not members and phase in (pg_api.FINISHED, pg_api.FAILED) and pg.status is not None:
        # An ended gang whose pods were deleted: the counts it ended with stay.
        for key in _COUNTS:
            status[key] = getattr(pg.status, key) or 0
    return status


def decide(pg: pg_api.PodGroup, members: Sequence[k8s.Pod]) -> dict[str, Any] | None:
    """The status to write on ``pg`` (a merge patch of status), or None when it holds it."""
    status = podgroup_status(pg, members)
    current = pg.status.to_dict() if pg.status is not None else {}
    if all(current.get(k, 0 if k in _COUNTS else None) == v for k, v in status.items()):
        return None
    return status


def decide_podgroup(key: str, pg: pg_api.PodGroup, members: Sequence[k8s.Pod]) -> Actions:
    """``decide`` as Actions: a merge patch of the PodGroup's status subresource."""
    status = decide(pg, members)
    if status is None:
        return Actions(reason="InSync")
    namespace, _, name = key.partition("/")
    return Actions(patches=[Patch(pg_api.PodGroup, name, namespace, {"status": status}, subresource="status")],
                   reason=str(status["phase"]))


def _model(cls: Any, obj: Any) -> Any:
    return obj if isinstance(obj, cls) else cls.model_validate(obj)


class PodGroupController(KeyedController):
    name = "podgroup"
    model = pg_api.PodGroup

    def __init__(self, client: Client, informers: SharedInformerFactory, **kwargs: Any) -> None:
        super().__init__(client, informers, **kwargs)
        self.podgroup_informer = self.informer
        self.pod_informer = informers.informer(k8s.Pod)
        self.pod_informer.add_indexer(POD_GROUP_INDEX, lambda pod: pg_api.group_of(_model(k8s.Pod, pod)))
        self.pod_informer.add_event_handler(self._pod_event, self._pod_changed, self._pod_event)

    def _pod_event(self, pod: Any) -> None:
        group = pg_api.group_of(_model(k8s.Pod, pod))
        if group is not None:
            self.controller.enqueue(group)

    def _pod_changed(self, old: Any, new: Any) -> None:
        self._pod_event(new)
        if old is not None:
            self._pod_event(old)

    async def sync(self, key: str, cached: Any | None) -> Requeue | None:
        if cached is None:
            return None
        pg = _model(pg_api.PodGroup, cached)
        members = [_model(k8s.Pod, p) for p in self.pod_informer.by_index(POD_GROUP_INDEX, key)]
        try:
            await self.act(key, None, decide_podgroup(key, pg, members))
        except NotFound:
            pass
        return None
