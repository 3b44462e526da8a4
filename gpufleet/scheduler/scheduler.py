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
(gangcycle.GangCycles, over gang.place_gang). At least ``minMember`` fit: all are assumed and bound. Otherwise none
is, nothing is held, and every member goes back to the queue with the same reason; a gang
with fewer than ``minMember`` members waits for the rest, reported on the PodGroup after
``scheduleTimeoutSeconds`` (gang.GangState keeps the members and the waits). The scheduler
writes the PodGroup's ``status.scheduleStartTime``; the rest of its status is the PodGroup
controller's (controllers/podgroup.py).

Preemption (preemption.DefaultPreemption, once per pod or once per gang, carried out by
preemptor.Preemptor): the victims are deleted gracefully in the background and the
preemptor is nominated to their node; until it binds, its room there is held against pods
of lower priority (nominated pods are placed on the snapshot of their cycles). What the
user is told (Events, PodScheduled, the diagnosis) is written by reporting.Reporter.
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
from gpufleet.api import volcano as vc_api
from gpufleet.api.gpu import GPUS_ANNOTATION
from gpufleet.client.errors import Conflict, NotFound
from gpufleet.client.events import NORMAL, WARNING, EventRecorder
from gpufleet.client.informer import InformerScope, SharedInformerFactory
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
from gpufleet.scheduler.gang import GangPlacement, GangState
from gpufleet.scheduler.gangcycle import GangCycles
from gpufleet.scheduler.preemption import VICTIMS_KEY, Candidate
from gpufleet.scheduler.preemptor import Preemptor
from gpufleet.scheduler.profile import Profile
from gpufleet.scheduler.queue import BACKOFF, UNSCHEDULABLE, QueueClosed, QueuedPodInfo, SchedulingQueue
from gpufleet.scheduler.reporting import Reporter
from gpufleet.scheduler.snapshot import PodInfo, Snapshot
from gpufleet.scheduler.volumes import StorageTracker
from gpufleet.utils.clock import REAL_CLOCK, Clock

log = logging.getLogger(__name__)



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


class Scheduler(GangCycles):
    """``Scheduler(client, clock=..., profile=...)``; ``await start()`` ... ``await stop()``.

    Pass ``informers`` to share a SharedInformerFactory with other components in the same
    process (it is then started and stopped by its owner, not here): the scheduler adds its
    handlers through an InformerScope of it, removes them when it stops, and starts
    scheduling only once they have been given the whole cache.
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
        # Set after scheduling cycles: wakes housekeeping that had nothing to look after.
        self._housekeeping_wake = asyncio.Event()
        # Scheduling cycles run back to back for at most this long (seconds) and this many
        # before the loop yields to the rest of the process.
        self.batch_budget = batch_budget
        self.max_batch = max_batch
        self.stop_timeout = stop_timeout
        self.stats: Counter[str] = Counter()
        self._informers: SharedInformerFactory | InformerScope | None = (
            InformerScope(informers) if informers is not None else None)
        self._own_informers = informers is None
        self._snapshot = Snapshot()
        self._interested: dict[str, set[str]] = {}
        self._tasks: list[asyncio.Task[Any]] = []
        self._background: set[asyncio.Task[Any]] = set()
        self._pod_informer: Any = None
        self._podgroup_informer: Any = None
        self._volcano_podgroup_informer: Any = None
        self._pdb_informer: Any = None
        self._handlers: list[tuple[Any, Any]] = []
        # Pod queue key -> its binding cycle in flight (cancelled when the pod is deleted:
        # a PreBind may wait minutes for its volumes).
        self._bindings: dict[str, asyncio.Task[Any]] = {}
        self._started = False
        self.gangs = GangState()
        self.preemptor = Preemptor(client, self.handle, self.recorder, clock=clock,
                                   scheduler_name=self.profile.scheduler_name, spawn=self._spawn)
        self.reporter = Reporter(client, self.recorder, clock=clock, latest=self._latest)

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self, *, sync_timeout: float | None = None) -> None:
        """Start watching, wait until the caches are filled, then start scheduling.
        Raises TimeoutError when the caches did not fill within ``sync_timeout`` seconds."""
        if self._started:
            return
        factory = self._informers or SharedInformerFactory(self.client, strip_managed_fields=True)
        self._informers = factory
        node_informer = factory.informer("nodes")
        self._pod_informer = factory.informer("pods")
        self._podgroup_informer = factory.informer(pg_api.PodGroup)
        self._volcano_podgroup_informer = factory.informer(vc_api.VolcanoPodGroup)
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
            (
                self._volcano_podgroup_informer,
                self._volcano_podgroup_informer.add_event_handler(
                    self._on_podgroup, self._on_volcano_podgroup_update, self._on_podgroup_delete
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
        ]

    async def stop(self) -> None:
        for informer, handlers in self._handlers:
            informer.remove_event_handler(handlers)
        self._handlers = []
        if isinstance(self._informers, InformerScope):
            await self._informers.stop()
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
        return not name or name == self.profile.scheduler_name or name in self.profile.also_answers_to

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
        self.gangs.track(_queue_key(pod), pod)
        if _assigned(pod):
            self.cache.add_pod(pod)
            return
        self._enqueue(pod)

    def _on_pod_update(self, old: Any, new: Any) -> None:
        new = _pod(new)
        old = _pod(old) if old is not None else None
        self.gangs.track(_queue_key(new), new)
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
        self.gangs.untrack(key, pod)
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
        if nominated and not self.preemptor.is_nominated(_queue_key(pod)):
            # Nominated before this scheduler (re)started: keep holding the room.
            self._nominate(pod_info, nominated)
        qpi = self.queue.add(pod_info)
        if qpi.gated:
            self._spawn(self.reporter.gated(pod_info), "gated")

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
            self._housekeeping_wake.set()
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
            self._spawn(self.reporter.unschedulable(pod_info, result), f"report:{pod_info.key}")
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
            await self.reporter.clear_diagnosis(pod_info)
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

    def _latest(self, pod_info: PodInfo) -> k8s.Pod | None:
        current = self._pod_informer.get(pod_info.key) if self._pod_informer is not None else None
        return _pod(current) if current is not None else None

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
        for nominee in self.preemptor.nominees(pod_info, own_group):
            if snapshot.get(nominee.node_name) is not None:
                snapshot.add_pod(nominee)

    def _nominate(self, pod_info: PodInfo, node: str) -> None:
        self.preemptor.nominate(pod_info, node)

    def _forget_nomination(self, key: str) -> None:
        self.preemptor.forget(key)

    def _start_preemption(self, preemptor: PodInfo, candidate: Candidate) -> None:
        """Nominate the preemptor now (so the next cycles leave the room to it) and evict
        the victims in the background."""
        self.stats["preemptions"] += 1
        self.preemptor.start([(preemptor, candidate.node)], candidate.victims, preemptor.key)

    # -- periodic work -------------------------------------------------------------------------

    def _housekeeping_idle(self) -> bool:
        """Nothing for housekeeping to look after: no pod backing off or unschedulable, no
        assumption that can expire, no gang waiting. Only a scheduling cycle changes that."""
        pending = self.queue.pending()
        return (not pending[BACKOFF] and not pending[UNSCHEDULABLE] and not self.gangs.waiting
                and not self.cache.expiring())

    async def _housekeeping(self) -> None:
        ticks = 0
        while True:
            if self._housekeeping_idle():
                # Idle, it sleeps until a scheduling cycle: a quiet cluster (or a replay in
                # virtual time) is not woken every flush interval for nothing.
                self._housekeeping_wake.clear()
                await self._housekeeping_wake.wait()
                continue
            await self.clock.sleep(self.flush_interval)
            ticks += 1
            try:
                self.queue.flush_backoff_completed()
                if ticks % 30 == 0:
                    self.queue.flush_unschedulable_left_over()
                if self.cache.cleanup_expired():
                    self._move(POD_DELETE)
                if self.gangs.waiting:
                    self._check_gang_timeouts()
                for name, count in self.queue.pending().items():
                    metrics.PENDING_PODS.labels(name).set(count)
            except Exception:
                log.exception("scheduler housekeeping failed")


def _binding_message(status: Status) -> str:
    if status.is_rejected:
        return status.message
    return f"Binding rejected: {status.message}"
