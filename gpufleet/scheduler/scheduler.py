"""The scheduler loop: informers in, decisions out, with I/O only at the edges.

    informers (Nodes, Pods) --> cache (NodeInfos, assumed pods)
                            \\-> queue (pending pods)
    loop: pop a pod -> framework.schedule(pod, snapshot)      (pure, no awaits)
          -> fits:    assume in the cache, Permit, then bind in the background:
                      PreBind (GPU indices annotation) -> Bind (pods/binding)
                      failure: forget the assumption, back off, retry
          -> no node: back to the queue until a cluster event may help, and tell the
                      user: PodScheduled=False/Unschedulable and a FailedScheduling Event

A cycle never waits on the API, so the next pod is scheduled while earlier bindings are
still in flight; the cache's assumptions keep those cycles from double-booking.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections import Counter
from collections.abc import Coroutine
from typing import Any

from gpufleet.api import k8s
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
    Code,
    FitError,
    Framework,
    FrameworkHandle,
    Registry,
    ScheduleResult,
    SchedulingError,
    Status,
)
from gpufleet.scheduler.gpu import GPUS_ANNOTATION, SCHEDULING_DIAGNOSIS_ANNOTATION
from gpufleet.scheduler.profile import Profile
from gpufleet.scheduler.queue import QueueClosed, QueuedPodInfo, SchedulingQueue
from gpufleet.scheduler.snapshot import PodInfo, Snapshot
from gpufleet.utils.clock import REAL_CLOCK, Clock, rfc3339

log = logging.getLogger(__name__)

POD_SCHEDULED = "PodScheduled"
REASON_UNSCHEDULABLE = "Unschedulable"
REASON_SCHEDULING_GATED = "SchedulingGated"
GATED_MESSAGE = "Scheduling is blocked due to non-empty scheduling gates"
# Lines of the per-node breakdown kept on the pod; enough to see the pattern on a big cluster.
DIAGNOSIS_LINES = 20


def _pod(obj: Any) -> k8s.Pod:
    return obj if isinstance(obj, k8s.Pod) else k8s.Pod.model_validate(obj)


def _node(obj: Any) -> k8s.Node:
    return obj if isinstance(obj, k8s.Node) else k8s.Node.model_validate(obj)


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
        rng: random.Random | None = None,
    ) -> None:
        self.client = client
        self.clock = clock
        self.profile = profile or Profile()
        self.handle = FrameworkHandle(client=client, clock=clock)
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
        self.stop_timeout = stop_timeout
        self.stats: Counter[str] = Counter()
        self._informers = informers
        self._own_informers = informers is None
        self._snapshot = Snapshot()
        self._interested: dict[str, set[str]] = {}
        self._tasks: list[asyncio.Task[Any]] = []
        self._background: set[asyncio.Task[Any]] = set()
        self._pod_informer: Any = None
        self._handlers: list[tuple[Any, Any]] = []
        self._started = False

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
        self._handlers = [
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

    def _spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

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
        if _assigned(pod):
            self.cache.add_pod(pod)
            return
        self._enqueue(pod)

    def _on_pod_update(self, old: Any, new: Any) -> None:
        new = _pod(new)
        old = _pod(old) if old is not None else None
        if _assigned(new):
            if old is None or not _assigned(old):
                self.queue.delete(_queue_key(new))
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
        waiting = self.framework.get_waiting_pod(key)
        if waiting is not None:
            waiting.reject("", "pod was deleted")
        if _assigned(pod) or self.cache.is_assumed(pod):
            self.cache.remove_pod(pod)
            self._move(POD_DELETE)

    def _enqueue(self, pod: k8s.Pod) -> None:
        meta = pod.metadata or k8s.ObjectMeta()
        if not self._responsible(pod) or _terminal(pod) or meta.deletion_timestamp is not None:
            self.queue.delete(_queue_key(pod))
            return
        pod_info = PodInfo(pod)
        qpi = self.queue.add(pod_info)
        if qpi.gated:
            self._spawn(
                self._set_pod_scheduled_false(pod_info, REASON_SCHEDULING_GATED, GATED_MESSAGE), "gated"
            )

    # -- the scheduling cycle ---------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            try:
                qpi = await self.queue.pop()
            except QueueClosed:
                return
            try:
                self.schedule_one(qpi)
            except Exception:
                log.exception("scheduling %s failed", qpi.pod_info.key)
                self.queue.requeue_after_error(qpi)
            # Let informer events in between cycles: a long queue must not starve them.
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

    def schedule_one(self, qpi: QueuedPodInfo) -> ScheduleResult | FitError | None:
        """One cycle for one popped pod; starts its binding in the background on success."""
        pod_info = qpi.pod_info
        if self._skip(pod_info):
            return None
        cycle = self.queue.scheduling_cycle
        profile = self.profile.scheduler_name
        start = self.clock.monotonic()
        self.cache.update_snapshot(self._snapshot)
        try:
            result = self.framework.schedule(pod_info, self._snapshot)
        except SchedulingError as exc:
            log.error("scheduling %s: %s", pod_info.key, exc)
            self._observe("error", start, profile)
            qpi.unschedulable_plugins = set()
            self.queue.add_unschedulable_if_not_present(qpi, cycle)
            return None
        if isinstance(result, FitError):
            self._observe("unschedulable", start, profile)
            qpi.unschedulable_plugins = set(result.diagnosis.unschedulable_plugins)
            self.queue.add_unschedulable_if_not_present(qpi, cycle)
            self._spawn(self._report_unschedulable(pod_info, result), f"report:{pod_info.key}")
            return result
        state = result.state
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
        self._spawn(self._binding_cycle(qpi, assumed, result), f"bind:{pod_info.key}")
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
        try:
            await self.client.patch(
                "pods",
                pod_info.name,
                {"status": {"conditions": [condition]}},
                pod_info.namespace,
                patch_type="strategic",
                subresource="status",
                raw=True,
            )
            if diagnosis is not None:
                await self.client.patch(
                    "pods",
                    pod_info.name,
                    {"metadata": {"annotations": {SCHEDULING_DIAGNOSIS_ANNOTATION: diagnosis}}},
                    pod_info.namespace,
                    patch_type="merge",
                    raw=True,
                )
        except NotFound:
            pass
        except ApiError as exc:
            log.warning("could not update the PodScheduled condition of %s: %s", pod_info.key, exc)

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
                for name, count in self.queue.pending().items():
                    metrics.PENDING_PODS.labels(name).set(count)
            except Exception:
                log.exception("scheduler housekeeping failed")


def _binding_message(status: Status) -> str:
    if status.is_rejected:
        return status.message
    return f"Binding rejected: {status.message}"
