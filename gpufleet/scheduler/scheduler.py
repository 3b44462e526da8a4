"""The scheduler loop: informers in, decisions out, with I/O only at the edges.

    informers (Nodes, Pods) --> cache (NodeInfos, assumed pods)
                            \\-> queue (pending pods)
    informers (claims, volumes, storage classes) --> storage state (on each snapshot)
    loop: pop a pod -> framework.schedule(pod, snapshot)      (pure, no awaits)
          -> fits:    assume in the cache, Permit, then bind in the background:
                      PreBind (claims waiting for their first consumer get the node
                      and are waited for) -> Bind (pods/binding)
                      failure: forget the assumption, back off, retry
          -> no node: back to the queue until a cluster event may help, and tell the
                      user: PodScheduled=False/Unschedulable and a FailedScheduling Event

A cycle never waits on the API, so the next pod is scheduled while earlier bindings are
still in flight; the cache's assumptions keep those cycles from double-booking. The loop
runs cycles back to back while pods are waiting (up to ``batch_budget`` seconds or
``max_batch`` cycles) before it yields: in one process with the API server, one pod per
event-loop turn would pace a burst by the length of those turns, not by the cycles.

Gangs (pods labelled ``scheduling.x-k8s.io/pod-group``): popping one member takes every
pending member of its PodGroup out of the queue and places them all in one cycle
(gang.place_gang). At least ``minMember`` fit: all are assumed and bound. Otherwise none
is, nothing is held, and every member goes back to the queue with the same reason; a gang
with fewer than ``minMember`` members waits for the rest, reported on the PodGroup after
``scheduleTimeoutSeconds``. The scheduler also keeps each PodGroup's status.

Preemption (preemption.DefaultPreemption, once per pod or once per gang): the victims are
deleted gracefully in the background and the preemptor is nominated to their node; until
it binds, its room there is held against pods of lower priority (nominated pods are placed
on the snapshot of their cycles).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
from collections import Counter
from collections.abc import Coroutine
from typing import Any

from gpufleet.api import k8s
from gpufleet.api import podgroup as pg_api
from gpufleet.api.gpu import GPUS_ANNOTATION, SCHEDULING_DIAGNOSIS_ANNOTATION
from gpufleet.client.errors import ApiError, Conflict, NotFound
from gpufleet.client.events import NORMAL, WARNING, EventRecorder
from gpufleet.client.informer import SharedInformerFactory
from gpufleet.scheduler import metrics
from gpufleet.scheduler.cache import SchedulerCache
from gpufleet.scheduler.framework import (
    NODE_ADD,
    NODE_ALLOCATABLE,
    NODE_ANNOTATION,
    NODE_LABEL,
    NODE_TAINT,
    POD_DELETE,
    PV_ADD,
    PV_UPDATE,
    PVC_ADD,
    PVC_UPDATE,
    STORAGE_CLASS_ADD,
    Code,
    CycleState,
    FitError,
    Framework,
    FrameworkHandle,
    Registry,
    ScheduleResult,
    SchedulingError,
    Status,
)
from gpufleet.scheduler.gang import GangPlacement, place_gang, plan_gang_preemption
from gpufleet.scheduler.preemption import VICTIMS_KEY, Candidate
from gpufleet.scheduler.profile import Profile
from gpufleet.scheduler.queue import QueueClosed, QueuedPodInfo, SchedulingQueue
from gpufleet.scheduler.snapshot import PodInfo, Snapshot
from gpufleet.scheduler.volumes import StorageTracker
from gpufleet.utils.clock import REAL_CLOCK, Clock, rfc3339

log = logging.getLogger(__name__)

POD_SCHEDULED = "PodScheduled"
REASON_UNSCHEDULABLE = "Unschedulable"
REASON_SCHEDULING_GATED = "SchedulingGated"
GATED_MESSAGE = "Scheduling is blocked due to non-empty scheduling gates"
# Lines of the per-node breakdown kept on the pod; enough to see the pattern on a big cluster.
DIAGNOSIS_LINES = 20
# What gang members wait for besides resources (a missing member or PodGroup): only the
# group's own changes wake them, not cluster events.
COSCHEDULING = "Coscheduling"
DISRUPTION_TARGET = "DisruptionTarget"
REASON_PREEMPTION = "PreemptionByScheduler"


def _pod(obj: Any) -> k8s.Pod:
    return obj if isinstance(obj, k8s.Pod) else k8s.Pod.model_validate(obj)


def _node(obj: Any) -> k8s.Node:
    return obj if isinstance(obj, k8s.Node) else k8s.Node.model_validate(obj)


def _model(cls: Any, obj: Any) -> Any:
    return obj if isinstance(obj, cls) else cls.model_validate(obj)


def _pod_key(pod: k8s.Pod) -> str:
    meta = pod.metadata or k8s.ObjectMeta()
    return f"{meta.namespace or ''}/{meta.name or ''}"


def _assigned(pod: k8s.Pod) -> bool:
    return bool(pod.spec is not None and pod.spec.node_name)


def _terminal(pod: k8s.Pod) -> bool:
    return pod.status is not None and pod.status.phase in ("Succeeded", "Failed")


def _queue_key(pod: k8s.Pod) -> str:
    meta = pod.metadata or k8s.ObjectMeta()
    return meta.uid or f"{meta.namespace or ''}/{meta.name or ''}"


def node_update_events(old: k8s.Node | None, new: k8s.Node) -> list[str]:
    """Which cluster events a node update amounts to (a heartbeat amounts to none)."""
    if old is None:
        return [NODE_ADD]
    events = []
    old_status, new_status = old.status or k8s.NodeStatus(), new.status or k8s.NodeStatus()
    if (old_status.allocatable, old_status.capacity) != (new_status.allocatable, new_status.capacity):
        events.append(NODE_ALLOCATABLE)
    old_meta, new_meta = old.metadata or k8s.ObjectMeta(), new.metadata or k8s.ObjectMeta()
    if (old_meta.labels or {}) != (new_meta.labels or {}):
        events.append(NODE_LABEL)
    old_spec, new_spec = old.spec or k8s.NodeSpec(), new.spec or k8s.NodeSpec()
    if (old_spec.taints, bool(old_spec.unschedulable)) != (new_spec.taints, bool(new_spec.unschedulable)):
        events.append(NODE_TAINT)
    if (old_meta.annotations or {}).get(GPUS_ANNOTATION) != (new_meta.annotations or {}).get(GPUS_ANNOTATION):
        events.append(NODE_ANNOTATION)
    return events


class Scheduler:
    """``Scheduler(client, clock=..., profile=...)``; ``await start()`` ... ``await stop()``.

    Pass ``informers`` to share a SharedInformerFactory with other components in the same
    process (it is then started and stopped by its owner, not here).
    """

    def __init__(
        self,
        client: Any,
        *,
        clock: Clock = REAL_CLOCK,
        profile: Profile | None = None,
        registry: Registry | None = None,
        informers: SharedInformerFactory | None = None,
        assumed_pod_ttl: float | None = 30.0,
        initial_backoff: float = 1.0,
        max_backoff: float = 10.0,
        flush_interval: float = 1.0,
        stop_timeout: float = 3.0,
        batch_budget: float = 0.02,
        max_batch: int = 256,
        rng: random.Random | None = None,
    ) -> None:
        self.client = client
        self.clock = clock
        self.profile = profile or Profile()
        self.handle = FrameworkHandle(client=client, clock=clock)
        # Claims, volumes and classes: copied onto each cycle's snapshot, and waited on by
        # VolumeBinding's PreBind.
        self.storage = StorageTracker()
        self.handle.volumes = self.storage
        self.framework = Framework(self.profile, registry=registry, handle=self.handle, rng=rng)
        self.cache = SchedulerCache(clock=clock, ttl=assumed_pod_ttl)
        self.queue = SchedulingQueue(
            self.framework.less,
            clock=clock,
            initial_backoff=initial_backoff,
            max_backoff=max_backoff,
            pre_enqueue=lambda pod_info: self.framework.run_pre_enqueue(pod_info).is_success,
        )
        self.recorder = EventRecorder(client, self.profile.scheduler_name, clock=clock)
        self.flush_interval = flush_interval
        # Scheduling cycles run back to back for at most this long (seconds) and this many
        # before the loop yields to the rest of the process.
        self.batch_budget = batch_budget
        self.max_batch = max_batch
        self.stop_timeout = stop_timeout
        self.stats: Counter[str] = Counter()
        self._informers = informers
        self._own_informers = informers is None
        self._snapshot = Snapshot()
        self._interested: dict[str, set[str]] = {}
        self._tasks: list[asyncio.Task[Any]] = []
        self._background: set[asyncio.Task[Any]] = set()
        self._pod_informer: Any = None
        self._podgroup_informer: Any = None
        self._pdb_informer: Any = None
        self._handlers: list[tuple[Any, Any]] = []
        # Pod queue key -> its binding cycle in flight (cancelled when the pod is deleted:
        # a PreBind may wait minutes for its volumes).
        self._bindings: dict[str, asyncio.Task[Any]] = {}
        self._started = False
        # PodGroup 'namespace/name' -> queue key -> member pod (every phase).
        self._members: dict[str, dict[str, k8s.Pod]] = {}
        # Pod queue key -> the pod placed on the node preemption nominated it for: what it
        # holds there (against pods of no higher priority) while its victims terminate.
        self._nominated: dict[str, PodInfo] = {}
        # PodGroup -> (monotonic, wall) time of its first unsuccessful gang cycle in a row.
        self._gang_since: dict[str, tuple[float, float]] = {}
        self._dirty_groups: set[str] = set()
        self._groups_changed = asyncio.Event()

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self, *, sync_timeout: float | None = None) -> None:
        """Start watching, wait until the caches are filled, then start scheduling.
        Raises TimeoutError when the caches did not fill within ``sync_timeout`` seconds."""
        if self._started:
            return
        factory = self._informers or SharedInformerFactory(self.client)
        self._informers = factory
        node_informer = factory.informer("nodes")
        self._pod_informer = factory.informer("pods")
        self._podgroup_informer = factory.informer(pg_api.PodGroup)
        self._pdb_informer = factory.informer("poddisruptionbudgets")
        claims = factory.informer("persistentvolumeclaims")
        volumes = factory.informer("persistentvolumes")
        classes = factory.informer("storageclasses")
        self._handlers = [
            (claims, claims.add_event_handler(
                self._storage_event(self.storage.put_claim, PVC_ADD),
                self._storage_update(self.storage.put_claim, PVC_UPDATE),
                self._storage_event(self.storage.delete_claim, None))),
            (volumes, volumes.add_event_handler(
                self._storage_event(self.storage.put_volume, PV_ADD),
                self._storage_update(self.storage.put_volume, PV_UPDATE),
                self._storage_event(self.storage.delete_volume, None))),
            (classes, classes.add_event_handler(
                self._storage_event(self.storage.put_class, STORAGE_CLASS_ADD),
                self._storage_update(self.storage.put_class, STORAGE_CLASS_ADD),
                self._storage_event(self.storage.delete_class, None))),
            (
                node_informer,
                node_informer.add_event_handler(
                    self._on_node_add, self._on_node_update, self._on_node_delete
                ),
            ),
            (
                self._pod_informer,
                self._pod_informer.add_event_handler(
                    self._on_pod_add, self._on_pod_update, self._on_pod_delete
                ),
            ),
            (
                self._podgroup_informer,
                self._podgroup_informer.add_event_handler(
                    self._on_podgroup, self._on_podgroup_update, self._on_podgroup_delete
                ),
            ),
        ]
        # Also when the factory is shared: informers asked for after its owner started it
        # start only now (starting one already running does nothing).
        await factory.start()
        if not await factory.wait_for_sync(sync_timeout):
            raise TimeoutError("the scheduler's node and pod caches did not sync")
        self._started = True
        self._tasks = [
            asyncio.create_task(self._run(), name="scheduler:loop"),
            asyncio.create_task(self._housekeeping(), name="scheduler:housekeeping"),
            asyncio.create_task(self._podgroup_status_loop(), name="scheduler:podgroup-status"),
        ]

    async def stop(self) -> None:
        for informer, handlers in self._handlers:
            informer.remove_event_handler(handlers)
        self._handlers = []
        self.queue.close()
        tasks = [*self._tasks, *self._background]
        self._tasks = []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._own_informers and self._informers is not None:
            # Bounded: a watch whose cancellation gets lost further down (asyncio.wait_for
            # on Python 3.11 can swallow one) must not hang the scheduler's shutdown.
            stopping = asyncio.ensure_future(self._informers.stop())
            done, _ = await asyncio.wait({stopping}, timeout=self.stop_timeout)
            if not done:
                log.warning("the scheduler's informers did not stop within %gs", self.stop_timeout)
        self._started = False

    def _spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    def _spawn_binding(self, qpi: QueuedPodInfo, assumed: PodInfo, result: ScheduleResult) -> None:
        task = self._spawn(self._binding_cycle(qpi, assumed, result), f"bind:{qpi.pod_info.key}")
        self._bindings[qpi.key] = task
        task.add_done_callback(functools.partial(self._binding_done, qpi.key))

    def _binding_done(self, key: str, task: asyncio.Task[Any]) -> None:
        if self._bindings.get(key) is task:
            del self._bindings[key]

    async def wait_idle(self) -> None:
        """Wait for the bindings and status writes in flight (tests)."""
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)

    # -- informer callbacks: bookkeeping only ------------------------------------------------

    def _responsible(self, pod: k8s.Pod) -> bool:
        name = pod.spec.scheduler_name if pod.spec is not None else None
        return not name or name == self.profile.scheduler_name

    def _move(self, event: str) -> None:
        interested = self._interested.get(event)
        if interested is None:
            interested = self._interested[event] = self.framework.plugins_for_event(event)
        self.queue.move_all_to_active_or_backoff(interested)

    def _storage_event(self, put: Any, event: str | None) -> Any:
        def handle(obj: Any) -> None:
            put(obj)
            if event is not None:
                self._move(event)

        return handle

    def _storage_update(self, put: Any, event: str) -> Any:
        def handle(old: Any, new: Any) -> None:
            put(new)
            self._move(event)

        return handle

    def _on_node_add(self, obj: Any) -> None:
        self.cache.add_node(_node(obj))
        self._move(NODE_ADD)

    def _on_node_update(self, old: Any, new: Any) -> None:
        new = _node(new)
        self.cache.update_node(None, new)
        for event in node_update_events(_node(old) if old is not None else None, new):
            self._move(event)

    def _on_node_delete(self, obj: Any) -> None:
        self.cache.remove_node(_node(obj))

    def _on_pod_add(self, obj: Any) -> None:
        pod = _pod(obj)
        self._track_member(pod)
        if _assigned(pod):
            self.cache.add_pod(pod)
            return
        self._enqueue(pod)

    def _on_pod_update(self, old: Any, new: Any) -> None:
        new = _pod(new)
        old = _pod(old) if old is not None else None
        self._track_member(new)
        if (new.metadata or k8s.ObjectMeta()).deletion_timestamp is not None:
            self.handle.pending_victims.discard(_pod_key(new))
        if _assigned(new):
            if old is None or not _assigned(old):
                self.queue.delete(_queue_key(new))
                self._forget_nomination(_queue_key(new))
            finished = _terminal(new) and (old is None or not _terminal(old))
            self.cache.update_pod(old, new)
            if finished:
                self._move(POD_DELETE)
            return
        if self.cache.is_assumed(new):
            # Our own GPU-indices patch, seen while the binding is in flight.
            return
        self._enqueue(new)

    def _on_pod_delete(self, obj: Any) -> None:
        pod = _pod(obj)
        key = _queue_key(pod)
        self.queue.delete(key)
        self._untrack_member(pod)
        self._forget_nomination(key)
        self.handle.pending_victims.discard(_pod_key(pod))
        waiting = self.framework.get_waiting_pod(key)
        if waiting is not None:
            waiting.reject("", "pod was deleted")
        binding = self._bindings.pop(key, None)
        if binding is not None and not binding.done():
            binding.cancel()
        if _assigned(pod) or self.cache.is_assumed(pod):
            self.cache.remove_pod(pod)
            self._move(POD_DELETE)

    def _enqueue(self, pod: k8s.Pod) -> None:
        meta = pod.metadata or k8s.ObjectMeta()
        if not self._responsible(pod) or _terminal(pod) or meta.deletion_timestamp is not None:
            self.queue.delete(_queue_key(pod))
            return
        pod_info = PodInfo(pod)
        nominated = pod.status.nominated_node_name if pod.status is not None else None
        if nominated and _queue_key(pod) not in self._nominated:
            # Nominated before this scheduler (re)started: keep holding the room.
            self._nominate(pod_info, nominated)
        qpi = self.queue.add(pod_info)
        if qpi.gated:
            self._spawn(
                self._set_pod_scheduled_false(pod_info, REASON_SCHEDULING_GATED, GATED_MESSAGE), "gated"
            )

    # -- the scheduling cycle ---------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            try:
                qpi: QueuedPodInfo | None = await self.queue.pop()
            except QueueClosed:
                return
            # Cycles back to back while pods are waiting, up to a time budget: yielding after
            # every cycle would give each one pod per turn of an event loop shared with the
            # API server and the controllers, whose turns take tens of milliseconds under a
            # burst. The cache's assumptions keep the cycles of one batch from double-booking.
            deadline = self.clock.monotonic() + self.batch_budget
            cycles = 0
            while qpi is not None:
                try:
                    self.schedule_one(qpi)
                except Exception:
                    log.exception("scheduling %s failed", qpi.pod_info.key)
                    self.queue.requeue_after_error(qpi)
                cycles += 1
                if cycles >= self.max_batch or self.clock.monotonic() >= deadline:
                    break
                qpi = self.queue.pop_nowait()
            # Let informer events and the bindings in: a long queue must not starve them.
            await asyncio.sleep(0)

    def _skip(self, pod_info: PodInfo) -> bool:
        if self._pod_informer is None:
            return False
        current = self._pod_informer.get(pod_info.key)
        if current is None:
            return True
        current = _pod(current)
        meta = current.metadata or k8s.ObjectMeta()
        return (
            (meta.uid or "") != pod_info.uid
            or meta.deletion_timestamp is not None
            or _assigned(current)
            or self.cache.is_assumed(current)
        )

    def schedule_one(self, qpi: QueuedPodInfo) -> ScheduleResult | FitError | GangPlacement | None:
        """One cycle for one popped pod (or its whole gang); starts the bindings in the
        background on success."""
        pod_info = qpi.pod_info
        if self._skip(pod_info):
            return None
        if pod_info.pod_group:
            return self.schedule_gang(qpi)
        cycle = self.queue.scheduling_cycle
        profile = self.profile.scheduler_name
        start = self.clock.monotonic()
        self._refresh_snapshot(pod_info)
        state = CycleState()
        try:
            result = self.framework.schedule(pod_info, self._snapshot, state)
        except SchedulingError as exc:
            log.error("scheduling %s: %s", pod_info.key, exc)
            self._observe("error", start, profile)
            qpi.unschedulable_plugins = set()
            self.queue.add_unschedulable_if_not_present(qpi, cycle)
            return None
        if isinstance(result, FitError):
            self._observe("unschedulable", start, profile)
            qpi.unschedulable_plugins = set(result.diagnosis.unschedulable_plugins)
            candidate = state.read(VICTIMS_KEY) if result.diagnosis.nominated_node else None
            if candidate is not None:
                self._start_preemption(pod_info, candidate)
            self.queue.add_unschedulable_if_not_present(qpi, cycle)
            self._spawn(self._report_unschedulable(pod_info, result), f"report:{pod_info.key}")
            return result
        state = result.state
        self._forget_nomination(qpi.key)
        assumed = self.cache.assume_pod(pod_info, result.node, result.gpu_indices)
        permit = self.framework.run_permit(state, pod_info, result.node)
        if permit.code not in (Code.SUCCESS, Code.WAIT):
            self.cache.forget_pod(assumed)
            self.framework.run_unreserve(state, pod_info, result.node)
            self._observe("error" if permit.code is Code.ERROR else "unschedulable", start, profile)
            qpi.unschedulable_plugins = {permit.plugin} if permit.is_rejected else set()
            self.queue.add_unschedulable_if_not_present(qpi, cycle)
            return None
        self._observe("scheduled", start, profile)
        log.debug("%s -> %s (gpus %s)", pod_info.key, result.node, result.gpu_indices)
        self._spawn_binding(qpi, assumed, result)
        return result

    def _observe(self, result: str, start: float, profile: str) -> None:
        self.stats[result] += 1
        metrics.SCHEDULE_ATTEMPTS.labels(result, profile).inc()
        metrics.SCHEDULING_ATTEMPT_DURATION.labels(result, profile).observe(self.clock.monotonic() - start)

    # -- the binding cycle -------------------------------------------------------------------

    async def _binding_cycle(self, qpi: QueuedPodInfo, assumed: PodInfo, result: ScheduleResult) -> None:
        pod_info, node, state = qpi.pod_info, result.node, result.state
        status = await self.framework.wait_on_permit(pod_info)
        if status.is_success:
            status = await self.framework.run_pre_bind(state, pod_info, node)
        if status.is_success:
            status = await self.framework.run_bind(state, pod_info, node)
        if status.is_success:
            self.cache.finish_binding(assumed)
            self.framework.run_post_bind(state, pod_info, node)
            self.stats["bound"] += 1
            metrics.BINDINGS.labels("bound").inc()
            if qpi.initial_attempt_timestamp is not None:
                metrics.POD_SCHEDULING_DURATION.observe(
                    self.clock.monotonic() - qpi.initial_attempt_timestamp
                )
            await self.recorder.record(
                pod_info.pod, NORMAL, "Scheduled", f"Successfully assigned {pod_info.key} to {node}"
            )
            await self._clear_diagnosis(pod_info)
            return
        self._binding_failed(qpi, assumed, result, status)
        if status.is_rejected or not isinstance(status.error, NotFound):
            await self.recorder.record(pod_info.pod, WARNING, "FailedScheduling", _binding_message(status))

    def _binding_failed(
        self, qpi: QueuedPodInfo, assumed: PodInfo, result: ScheduleResult, status: Status
    ) -> None:
        pod_info = qpi.pod_info
        self.stats["bind_failed"] += 1
        metrics.BINDINGS.labels("failed").inc()
        self.cache.forget_pod(assumed)
        self.framework.run_unreserve(result.state, pod_info, result.node)
        # What the pod held is free again: pods waiting for room may fit now.
        self._move(POD_DELETE)
        error = status.error
        if isinstance(error, NotFound):
            return  # the pod is gone
        if isinstance(error, Conflict) and "already assigned" in (error.message or ""):
            return  # bound by someone else; the informer brings it to the cache
        log.warning("binding %s to %s failed: %s", pod_info.key, result.node, status.message)
        qpi.unschedulable_plugins = {status.plugin} if status.is_rejected and status.plugin else set()
        self.queue.add_unschedulable_if_not_present(qpi, self.queue.scheduling_cycle)

    # -- telling the user ---------------------------------------------------------------------

    async def _report_unschedulable(self, pod_info: PodInfo, error: FitError) -> None:
        message = error.message
        await self.recorder.record(pod_info.pod, WARNING, "FailedScheduling", message)
        # With no nodes at all there is nothing per node to add to the message.
        diagnosis = "\n".join(error.node_breakdown(DIAGNOSIS_LINES)) or None
        await self._set_pod_scheduled_false(pod_info, REASON_UNSCHEDULABLE, message, diagnosis)

    def _latest(self, pod_info: PodInfo) -> k8s.Pod | None:
        current = self._pod_informer.get(pod_info.key) if self._pod_informer is not None else None
        return _pod(current) if current is not None else None

    async def _set_pod_scheduled_false(
        self, pod_info: PodInfo, reason: str, message: str, diagnosis: str | None = None
    ) -> None:
        """PodScheduled=False with this reason and message, written only when it changed."""
        pod = self._latest(pod_info) or pod_info.pod
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

    async def _clear_diagnosis(self, pod_info: PodInfo) -> None:
        pod = self._latest(pod_info) or pod_info.pod
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

    # -- nominated pods and preemption --------------------------------------------------------

    def _refresh_snapshot(self, pod_info: PodInfo, own_group: str = "") -> None:
        """Bring the snapshot up to date for a cycle of ``pod_info``: the budgets preemption
        weighs, and the pods nominated by earlier preemptions placed on their nodes when
        they are at least as important (what their victims free is theirs)."""
        snapshot = self._snapshot
        self.cache.update_snapshot(snapshot)
        snapshot.storage = self.storage.state()
        snapshot.pdbs = (
            [_model(k8s.PodDisruptionBudget, o) for o in self._pdb_informer.list()]
            if (self._pdb_informer is not None)
            else []
        )
        if not self._nominated:
            return
        own = pod_info.uid or pod_info.key
        for key, nominee in self._nominated.items():
            if key == own or (own_group and nominee.pod_group == own_group):
                continue
            if nominee.priority < pod_info.priority or snapshot.get(nominee.node_name) is None:
                continue
            snapshot.add_pod(nominee)

    def _nominate(self, pod_info: PodInfo, node: str) -> None:
        key = pod_info.uid or pod_info.key
        self._nominated[key] = pod_info.assigned(node)
        self.handle.nominated_nodes[key] = node

    def _forget_nomination(self, key: str) -> None:
        if self._nominated.pop(key, None) is not None:
            self.handle.nominated_nodes.pop(key, None)

    def _start_preemption(self, preemptor: PodInfo, candidate: Candidate) -> None:
        """Nominate the preemptor now (so the next cycles leave the room to it) and evict
        the victims in the background."""
        self._nominate(preemptor, candidate.node)
        for victim in candidate.victims:
            self.handle.pending_victims.add(victim.key)
        self.stats["preemptions"] += 1
        self._spawn(
            self._preempt([(preemptor, candidate.node)], candidate.victims), f"preempt:{preemptor.key}"
        )

    async def _preempt(self, preemptors: list[tuple[PodInfo, str]], victims: list[PodInfo]) -> None:
        by = preemptors[0][0]
        group = by.pod_group
        who = f"pod group {group}" if group else by.key
        for victim in victims:
            node = victim.node_name
            await self._evict(victim, by, node)
        for pod_info, node in preemptors:
            await self._set_nominated_node(pod_info, node)
        nodes = sorted({node for _, node in preemptors})
        names = ", ".join(v.key for v in victims)
        for pod_info, node in preemptors:
            await self.recorder.record(
                pod_info.pod,
                NORMAL,
                "Preempting",
                f"Preempting {len(victims)} pod(s) for {who} on node(s) {', '.join(nodes)}: {names}; nominated to {node}",
            )

    async def _evict(self, victim: PodInfo, by: PodInfo, node: str) -> None:
        message = f"Preempted by {by.key} on node {node}"
        condition = {
            "type": DISRUPTION_TARGET,
            "status": "True",
            "reason": REASON_PREEMPTION,
            "message": f"{self.profile.scheduler_name}: preempting to accommodate a higher priority pod",
            "lastTransitionTime": rfc3339(self.clock.now()),
        }
        with contextlib.suppress(ApiError):
            await self.client.patch(
                "pods",
                victim.name,
                {"status": {"conditions": [condition]}},
                victim.namespace,
                patch_type="strategic",
                subresource="status",
                raw=True,
            )
        spec = victim.pod.spec
        grace = spec.termination_grace_period_seconds if spec is not None else None
        try:
            await self.client.delete(
                "pods",
                victim.name,
                victim.namespace,
                grace_period_seconds=grace,
                preconditions_uid=victim.uid or None,
            )
        except NotFound:
            return
        except ApiError as exc:
            log.warning("could not preempt %s: %s", victim.key, exc)
            self.handle.pending_victims.discard(victim.key)
            return
        log.info("preempted %s on %s for %s", victim.key, node, by.key)
        await self.recorder.record(victim.pod, NORMAL, "Preempted", message)

    async def _set_nominated_node(self, pod_info: PodInfo, node: str) -> None:
        with contextlib.suppress(ApiError):
            await self.client.patch(
                "pods",
                pod_info.name,
                {"status": {"nominatedNodeName": node}},
                pod_info.namespace,
                patch_type="merge",
                subresource="status",
                raw=True,
            )

    # -- gangs ----------------------------------------------------------------------------------

    def _track_member(self, pod: k8s.Pod) -> None:
        meta = pod.metadata or k8s.ObjectMeta()
        name = (meta.labels or {}).get(pg_api.POD_GROUP_LABEL)
        if not name:
            return
        group = f"{meta.namespace or ''}/{name}"
        self._members.setdefault(group, {})[_queue_key(pod)] = pod
        self._mark_group(group)

    def _untrack_member(self, pod: k8s.Pod) -> None:
        meta = pod.metadata or k8s.ObjectMeta()
        name = (meta.labels or {}).get(pg_api.POD_GROUP_LABEL)
        if not name:
            return
        group = f"{meta.namespace or ''}/{name}"
        members = self._members.get(group)
        if members is not None:
            members.pop(_queue_key(pod), None)
            if not members:
                del self._members[group]
                self._gang_since.pop(group, None)
        self._mark_group(group)

    def _mark_group(self, group: str) -> None:
        self._dirty_groups.add(group)
        self._groups_changed.set()

    def _podgroup(self, group: str) -> pg_api.PodGroup | None:
        if self._podgroup_informer is None:
            return None
        obj = self._podgroup_informer.get(group)
        return _model(pg_api.PodGroup, obj) if obj is not None else None

    def _on_podgroup(self, obj: Any) -> None:
        pg = _model(pg_api.PodGroup, obj)
        meta = pg.metadata or k8s.ObjectMeta()
        group = f"{meta.namespace or ''}/{meta.name or ''}"
        self._wake_group(group)
        self._mark_group(group)

    def _on_podgroup_update(self, old: Any, new: Any) -> None:
        before = _model(pg_api.PodGroup, old) if old is not None else None
        after = _model(pg_api.PodGroup, new)
        if before is not None and before.spec == after.spec:
            return  # a status write (ours): nothing for the gang to retry on
        self._on_podgroup(after)

    def _on_podgroup_delete(self, obj: Any) -> None:
        pg = _model(pg_api.PodGroup, obj)
        meta = pg.metadata or k8s.ObjectMeta()
        self._gang_since.pop(f"{meta.namespace or ''}/{meta.name or ''}", None)

    def _wake_group(self, group: str) -> None:
        members = self._members.get(group) or {}
        self.queue.activate(PodInfo(p) for key, p in members.items() if self.queue.get(key) is not None)

    def _bound_members(self, group: str) -> list[PodInfo]:
        out = []
        for pod in (self._members.get(group) or {}).values():
            placed = self.cache.get_pod(pod)
            if placed is not None and not placed.terminal:
                out.append(placed)
        return out

    def _take_gang(self, qpi: QueuedPodInfo) -> list[QueuedPodInfo]:
        """The popped member and every other pending member of its group, out of the queue."""
        gang = [qpi]
        for key in list(self._members.get(qpi.pod_info.pod_group) or ()):
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
        pg = self._podgroup(group)
        if pg is None:
            self._reject_gang(gang, f"pod group {group} not found", {COSCHEDULING}, cycle)
            self._observe("unschedulable", start, profile)
            return None
        min_member = pg_api.min_member(pg)
        bound = self._bound_members(group)
        existing = len(gang) + len(bound)
        if existing < min_member:
            timeout = pg_api.schedule_timeout(pg)
            self._gang_unsuccessful(group, pg, f"{existing} of minMember {min_member} members exist")
            message = (
                f"pod group {group}: {existing} of minMember {min_member} members exist; waiting for the "
                f"rest (scheduleTimeoutSeconds {timeout})"
            )
            self._reject_gang(gang, message, {COSCHEDULING}, cycle)
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
            self._gang_since.pop(group, None)
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
                self._spawn(self._report_unschedulable(member, error), f"report:{member.key}")
            self._mark_group(group)
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
            preemptors = []
            for q in gang:
                node = preemption.nodes.get(q.key)
                if node is not None:
                    self._nominate(q.pod_info, node)
                    preemptors.append((q.pod_info, node))
            for victim in preemption.victims:
                self.handle.pending_victims.add(victim.key)
            self.stats["preemptions"] += 1
            self._spawn(self._preempt(preemptors, preemption.victims), f"preempt:{group}")
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
    ) -> None:
        """Every member back to the queue, waiting on the same events, with the same reason."""
        for q in gang:
            q.unschedulable_plugins = set(plugins)
            self.queue.add_unschedulable_if_not_present(q, cycle)
            self._spawn(self._report_gang(q.pod_info, message, diagnosis), f"report:{q.pod_info.key}")
        self._mark_group(gang[0].pod_info.pod_group)

    async def _report_gang(self, pod_info: PodInfo, message: str, diagnosis: str | None) -> None:
        await self.recorder.record(pod_info.pod, WARNING, "FailedScheduling", message)
        await self._set_pod_scheduled_false(pod_info, REASON_UNSCHEDULABLE, message, diagnosis)

    def _gang_unsuccessful(self, group: str, pg: pg_api.PodGroup, why: str) -> None:
        """Start (or check) the group's schedule timeout; past it, say so and start over."""
        now = self.clock.monotonic()
        since = self._gang_since.get(group)
        if since is None:
            self._gang_since[group] = (now, self.clock.now())
            self._mark_group(group)
            return
        timeout = pg_api.schedule_timeout(pg)
        if now - since[0] < timeout:
            return
        self._gang_since[group] = (now, self.clock.now())
        self._mark_group(group)
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
        now = self.clock.monotonic()
        for group, (since, _) in list(self._gang_since.items()):
            pg = self._podgroup(group)
            if pg is not None and now - since >= pg_api.schedule_timeout(pg):
                self._wake_group(group)

    # -- PodGroup status --------------------------------------------------------------------------

    def podgroup_status(self, group: str, pg: pg_api.PodGroup) -> dict[str, Any]:
        """What status the PodGroup should have, from its members as this scheduler sees them."""
        members = list((self._members.get(group) or {}).values())
        min_member = pg_api.min_member(pg)
        scheduled = running = succeeded = failed = 0
        occupied_by = ""
        for pod in members:
            phase = pod.status.phase if pod.status is not None else None
            if _assigned(pod) or self.cache.is_assumed(pod):
                scheduled += 1
            if phase == "Running":
                running += 1
            elif phase == "Succeeded":
                succeeded += 1
            elif phase == "Failed":
                failed += 1
            if not occupied_by:
                occupied_by = _occupied_by(pod)
        previous = pg.status.phase if pg.status is not None else None
        phase = podgroup_phase(min_member, len(members), scheduled, running, succeeded, failed, previous)
        status: dict[str, Any] = {
            "phase": phase,
            "scheduled": scheduled,
            "running": running,
            "succeeded": succeeded,
            "failed": failed,
        }
        if occupied_by:
            status["occupiedBy"] = occupied_by
        if not members and phase in (pg_api.FINISHED, pg_api.FAILED) and pg.status is not None:
            # An ended gang whose pods were deleted: the counts it ended with stay.
            for key in ("scheduled", "running", "succeeded", "failed"):
                status[key] = getattr(pg.status, key) or 0
        since = self._gang_since.get(group)
        started = pg.status.schedule_start_time if pg.status is not None else None
        if since is not None:
            status["scheduleStartTime"] = rfc3339(since[1])
        elif started is not None:
            status["scheduleStartTime"] = rfc3339(started.timestamp())
        return status

    async def _podgroup_status_loop(self) -> None:
        while True:
            await self._groups_changed.wait()
            self._groups_changed.clear()
            # Let a burst of member changes land before writing.
            await asyncio.sleep(0.05)
            dirty, self._dirty_groups = self._dirty_groups, set()
            for group in sorted(dirty):
                try:
                    await self._write_podgroup_status(group)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("updating the status of pod group %s failed", group)

    async def _write_podgroup_status(self, group: str) -> None:
        pg = self._podgroup(group)
        if pg is None:
            return
        status = self.podgroup_status(group, pg)
        current = pg.status.to_dict() if pg.status is not None else {}
        if all(
            current.get(k, 0 if k in ("scheduled", "running", "succeeded", "failed") else None) == v
            for k, v in status.items()
        ):
            return
        namespace, _, name = group.partition("/")
        try:
            await self.client.patch(
                pg_api.PodGroup, name, {"status": status}, namespace, subresource="status", raw=True
            )
        except NotFound:
            pass
        except ApiError as exc:
            log.warning("could not update the status of pod group %s: %s", group, exc)
            self._mark_group(group)

    # -- periodic work -------------------------------------------------------------------------

    async def _housekeeping(self) -> None:
        ticks = 0
        while True:
            await self.clock.sleep(self.flush_interval)
            ticks += 1
            try:
                self.queue.flush_backoff_completed()
                if ticks % 30 == 0:
                    self.queue.flush_unschedulable_left_over()
                if self.cache.cleanup_expired():
                    self._move(POD_DELETE)
                if self._gang_since:
                    self._check_gang_timeouts()
                for name, count in self.queue.pending().items():
                    metrics.PENDING_PODS.labels(name).set(count)
            except Exception:
                log.exception("scheduler housekeeping failed")


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


def _occupied_by(pod: k8s.Pod) -> str:
    """scheduler-plugins' ``status.occupiedBy``: the workload the group's pods belong to, as
    ``<namespace>/<owner name>`` for each owner of a member (sorted, comma-separated)."""
    meta = pod.metadata or k8s.ObjectMeta()
    return ",".join(sorted(f"{meta.namespace}/{r.name}" for r in meta.owner_references or ()))


def _binding_message(status: Status) -> str:
    if status.is_rejected:
        return status.message
    return f"Binding rejected: {status.message}"
