"""The scheduling queue: which pending pod is tried next, and when a failed one is retried.

Three places a pending pod can wait, as in kube-scheduler:
- activeQ: a heap ordered by the profile's QueueSort plugin; ``pop`` takes from here.
- backoffQ: pods that failed recently, each until its back-off ends (1 s doubling per
  attempt up to 10 s by default), ordered by that time. While activeQ is empty, ``pop``
  takes the pod whose back-off ends first from here instead of waiting for it (as
  kube-scheduler's SchedulerPopFromBackoffQ does): an idle scheduler has no reason to make
  a pod wait. A pod backing off after an error is not taken early; it waits out its back-off.
- unschedulable: pods no node could take. They stay until a cluster event that may help
  them (a node added or changed, a pod deleted or finished) moves them back — only events
  that one of the plugins that rejected the pod registered for — or until they have waited
  ``max_unschedulable_seconds`` (a safety net for events nobody registered).

A pod that was rejected while a move was in progress (a cluster event arrived during its
cycle) goes to backoffQ rather than unschedulable, so the event is not lost on it.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from gpufleet.api.gpu import GPU_INDICES_ANNOTATION, SCHEDULING_DIAGNOSIS_ANNOTATION
from gpufleet.scheduler.snapshot import PodInfo
from gpufleet.utils.clock import REAL_CLOCK, Clock

ACTIVE = "active"
BACKOFF = "backoff"
UNSCHEDULABLE = "unschedulable"
GATED = "gated"


class QueueClosed(Exception):
    """pop() on a closed queue."""


@dataclass(eq=False)
class QueuedPodInfo:
    pod_info: PodInfo
    # Monotonic time the pod last entered the queue (back-off counts from it).
    timestamp: float
    # Monotonic time of the first attempt, for the end-to-end latency metric.
    initial_attempt_timestamp: float | None = None
    attempts: int = 0
    # Plugins that rejected the pod in its last cycle (empty: an error, retry on anything).
    unschedulable_plugins: set[str] = field(default_factory=set)
    # Kept out of activeQ by a PreEnqueue plugin (scheduling gates).
    gated: bool = False
    # Priority ties go to the older pod: its creation time, else when it was first queued.
    sort_timestamp: float = 0.0
    seq: int = 0

    @property
    def key(self) -> str:
        return self.pod_info.uid or self.pod_info.key


class _HeapItem:
    """Heap entry ordered by the QueueSort plugin, ties by arrival; ``valid`` is cleared
    instead of removing an entry from the middle of the heap."""

    __slots__ = ("qpi", "less", "valid")

    def __init__(self, qpi: QueuedPodInfo, less: Callable[[QueuedPodInfo, QueuedPodInfo], bool]) -> None:
        self.qpi = qpi
        self.less = less
        self.valid = True

    def __lt__(self, other: _HeapItem) -> bool:
        a, b = self.qpi, other.qpi
        if self.less(a, b):
            return True
        if self.less(b, a):
            return False
        return a.seq < b.seq


class SchedulingQueue:
    def __init__(
        self,
        less: Callable[[QueuedPodInfo, QueuedPodInfo], bool],
        *,
        clock: Clock = REAL_CLOCK,
        initial_backoff: float = 1.0,
        max_backoff: float = 10.0,
        max_unschedulable_seconds: float = 300.0,
        pre_enqueue: Callable[[PodInfo], bool] | None = None,
    ) -> None:
        self.less = less
        self.clock = clock
        self.initial_backoff = initial_backoff
        self.max_backoff = max_backoff
        self.max_unschedulable_seconds = max_unschedulable_seconds
        # True when the pod may enter activeQ (the framework's PreEnqueue plugins agree).
        self.pre_enqueue = pre_enqueue or (lambda pod_info: True)
        self._active: list[_HeapItem] = []
        self._active_items: dict[str, _HeapItem] = {}
        self._backoff: list[tuple[float, int, str]] = []
        # The same entries for the pods that were rejected (not errors): these may be popped
        # before their back-off ends while activeQ is empty.
        self._backoff_rejected: list[tuple[float, int, str]] = []
        self._backoff_pods: dict[str, QueuedPodInfo] = {}
        self._unschedulable: dict[str, QueuedPodInfo] = {}
        self._seq = itertools.count()
        self._not_empty = asyncio.Event()
        self._closed = False
        # Counts scheduling cycles (pops) and remembers the cycle of the last move request,
        # to tell whether a cluster event happened while a pod was being scheduled.
        self.scheduling_cycle = 0
        self._move_request_cycle = -1

    # -- where is a pod -------------------------------------------------------------------

    def where(self, key: str) -> str | None:
        if key in self._active_items:
            return ACTIVE
        if key in self._backoff_pods:
            return BACKOFF
        qpi = self._unschedulable.get(key)
        if qpi is not None:
            return GATED if qpi.gated else UNSCHEDULABLE
        return None

    def __len__(self) -> int:
        return len(self._active_items) + len(self._backoff_pods) + len(self._unschedulable)

    def pending(self) -> dict[str, int]:
        gated = sum(1 for q in self._unschedulable.values() if q.gated)
        return {
            ACTIVE: len(self._active_items),
            BACKOFF: len(self._backoff_pods),
            UNSCHEDULABLE: len(self._unschedulable) - gated,
            GATED: gated,
        }

    def get(self, key: str) -> QueuedPodInfo | None:
        item = self._active_items.get(key)
        if item is not None:
            return item.qpi
        return self._backoff_pods.get(key) or self._unschedulable.get(key)

    # -- adding ---------------------------------------------------------------------------

    def _new_queued(self, pod_info: PodInfo) -> QueuedPodInfo:
        now = self.clock.monotonic()
        created = pod_info.creation_timestamp
        return QueuedPodInfo(
            pod_info=pod_info,
            timestamp=now,
            sort_timestamp=created if created is not None else self.clock.now(),
            seq=next(self._seq),
        )

    def _push_active(self, qpi: QueuedPodInfo) -> None:
        if not self.pre_enqueue(qpi.pod_info):
            qpi.gated = True
            self._unschedulable[qpi.key] = qpi
            return
        qpi.gated = False
        item = _HeapItem(qpi, self.less)
        self._active_items[qpi.key] = item
        heapq.heappush(self._active, item)
        self._not_empty.set()

    def _push_backoff(self, qpi: QueuedPodInfo) -> None:
        self._backoff_pods[qpi.key] = qpi
        entry = (self.backoff_expiry(qpi), qpi.seq, qpi.key)
        heapq.heappush(self._backoff, entry)
        if qpi.unschedulable_plugins:
            heapq.heappush(self._backoff_rejected, entry)
            self._not_empty.set()

    def _remove(self, key: str) -> QueuedPodInfo | None:
        item = self._active_items.pop(key, None)
        if item is not None:
            item.valid = False
            return item.qpi
        qpi = self._backoff_pods.pop(key, None)
        if qpi is not None:
            return qpi  # its heap entry is skipped when it surfaces
        return self._unschedulable.pop(key, None)

    def add(self, pod_info: PodInfo) -> QueuedPodInfo:
        """A new pending pod (or one seen again): straight to activeQ unless already queued."""
        key = pod_info.uid or pod_info.key
        existing = self.get(key)
        if existing is not None:
            return self.update(pod_info) or existing
        qpi = self._new_queued(pod_info)
        self._push_active(qpi)
        return qpi

    def update(self, pod_info: PodInfo) -> QueuedPodInfo | None:
        """The pending pod changed. A change the scheduler cares about (spec, labels,
        annotations the plugins read) gives an unschedulable or gated pod another try now;
        None when the pod is not queued (it is being scheduled, or was never added)."""
        key = pod_info.uid or pod_info.key
        where = self.where(key)
        if where is None:
            return None
        qpi = self.get(key)
        assert qpi is not None
        changed = _scheduling_relevant(qpi.pod_info) != _scheduling_relevant(pod_info)
        qpi.pod_info = pod_info
        if where == ACTIVE:
            # Priority may have changed: re-insert to restore the heap order.
            self._remove(key)
            self._push_active(qpi)
        elif changed and where in (UNSCHEDULABLE, GATED):
            self._unschedulable.pop(key)
            if where == UNSCHEDULABLE and self.is_backing_off(qpi):
                self._push_backoff(qpi)
            else:
                self._push_active(qpi)
        return qpi

    def take(self, key: str) -> QueuedPodInfo | None:
        """Remove and return a queued pod wherever it waits (not a gated one): a gang's
        cycle takes all its pending members at once."""
        qpi = self.get(key)
        if qpi is None or qpi.gated:
            return None
        self._remove(key)
        qpi.attempts += 1
        if qpi.initial_attempt_timestamp is None:
            qpi.initial_attempt_timestamp = self.clock.monotonic()
        return qpi

    def delete(self, pod: PodInfo | str) -> None:
        """Forget a pod (by PodInfo or queue key): deleted, bound, or no longer ours."""
        self._remove(pod if isinstance(pod, str) else (pod.uid or pod.key))

    def add_unschedulable_if_not_present(self, qpi: QueuedPodInfo, scheduling_cycle: int) -> None:
        """After a failed cycle: to unschedulable, or to backoffQ when a cluster event came
        during the cycle (or the failure was an error, which no event resolves)."""
        if self.where(qpi.key) is not None:
            return
        qpi.timestamp = self.clock.monotonic()
        if self._move_request_cycle >= scheduling_cycle or not qpi.unschedulable_plugins:
            self._push_backoff(qpi)
        else:
            self._unschedulable[qpi.key] = qpi

    def requeue_after_error(self, qpi: QueuedPodInfo) -> None:
        qpi.unschedulable_plugins = set()
        self.add_unschedulable_if_not_present(qpi, self.scheduling_cycle)

    # -- taking ---------------------------------------------------------------------------

    def pop_nowait(self) -> QueuedPodInfo | None:
        """The next pod from activeQ; while it is empty, the rejected pod in backoffQ whose
        back-off ends first; None when neither has one."""
        qpi = self._pop_active() or self._pop_backoff_rejected()
        if qpi is None:
            self._not_empty.clear()
            return None
        qpi.attempts += 1
        if qpi.initial_attempt_timestamp is None:
            qpi.initial_attempt_timestamp = self.clock.monotonic()
        self.scheduling_cycle += 1
        return qpi

    def _pop_active(self) -> QueuedPodInfo | None:
        while self._active:
            item = heapq.heappop(self._active)
            if not item.valid:
                continue
            del self._active_items[item.qpi.key]
            return item.qpi
        return None

    def _pop_backoff_rejected(self) -> QueuedPodInfo | None:
        while self._backoff_rejected:
            expiry, _, key = heapq.heappop(self._backoff_rejected)
            qpi = self._backoff_pods.get(key)
            if qpi is None or not qpi.unschedulable_plugins or self.backoff_expiry(qpi) != expiry:
                continue  # removed or re-added since (its entry in _backoff is skipped likewise)
            del self._backoff_pods[key]
            return qpi
        return None

    async def pop(self) -> QueuedPodInfo:
        """The next pod to schedule, waiting for one; raises QueueClosed once closed."""
        while True:
            if self._closed:
                raise QueueClosed()
            qpi = self.pop_nowait()
            if qpi is not None:
                return qpi
            await self._not_empty.wait()

    def close(self) -> None:
        self._closed = True
        self._not_empty.set()

    # -- back-off ---------------------------------------------------------------------------

    def backoff_duration(self, qpi: QueuedPodInfo) -> float:
        attempts = max(qpi.attempts, 1)
        if attempts > 32:
            return self.max_backoff
        return min(self.initial_backoff * (2 ** (attempts - 1)), self.max_backoff)

    def backoff_expiry(self, qpi: QueuedPodInfo) -> float:
        return qpi.timestamp + self.backoff_duration(qpi)

    def is_backing_off(self, qpi: QueuedPodInfo) -> bool:
        return self.backoff_expiry(qpi) > self.clock.monotonic()

    def flush_backoff_completed(self) -> int:
        """Move pods whose back-off ended to activeQ; returns how many."""
        now = self.clock.monotonic()
        moved = 0
        while self._backoff:
            expiry, _, key = self._backoff[0]
            qpi = self._backoff_pods.get(key)
            if qpi is None or self.backoff_expiry(qpi) != expiry:
                heapq.heappop(self._backoff)  # removed or re-added since
                continue
            if expiry > now:
                break
            heapq.heappop(self._backoff)
            del self._backoff_pods[key]
            self._push_active(qpi)
            moved += 1
        # The entries of the pods that just left backoffQ lead the other heap: drop them.
        while self._backoff_rejected:
            expiry, _, key = self._backoff_rejected[0]
            qpi = self._backoff_pods.get(key)
            if qpi is not None and qpi.unschedulable_plugins and self.backoff_expiry(qpi) == expiry:
                break
            heapq.heappop(self._backoff_rejected)
        return moved

    def flush_unschedulable_left_over(self) -> int:
        """Give pods that waited too long in unschedulable another try."""
        now = self.clock.monotonic()
        stale = [
            q
            for q in self._unschedulable.values()
            if not q.gated and now - q.timestamp >= self.max_unschedulable_seconds
        ]
        for qpi in stale:
            del self._unschedulable[qpi.key]
            self._requeue_moved(qpi)
        return len(stale)

    def next_backoff_expiry(self) -> float | None:
        while self._backoff:
            expiry, _, key = self._backoff[0]
            qpi = self._backoff_pods.get(key)
            if qpi is not None and self.backoff_expiry(qpi) == expiry:
                return expiry
            heapq.heappop(self._backoff)
        return None

    # -- cluster events -----------------------------------------------------------------------

    def move_all_to_active_or_backoff(self, interested: Iterable[str] | None = None) -> int:
        """A cluster event that the plugins in ``interested`` (None: all) registered for:
        move the unschedulable pods one of them rejected. Returns how many moved."""
        self._move_request_cycle = self.scheduling_cycle
        plugins = None if interested is None else set(interested)
        moving = [
            q
            for q in self._unschedulable.values()
            if not q.gated
            and (plugins is None or not q.unschedulable_plugins or q.unschedulable_plugins & plugins)
        ]
        for qpi in moving:
            del self._unschedulable[qpi.key]
            self._requeue_moved(qpi)
        return len(moving)

    def _requeue_moved(self, qpi: QueuedPodInfo) -> None:
        if self.is_backing_off(qpi):
            self._push_backoff(qpi)
        else:
            self._push_active(qpi)

    def activate(self, pod_infos: Iterable[PodInfo]) -> None:
        """Move these pods to activeQ now, wherever they wait (a gang's siblings, say)."""
        for pod_info in pod_infos:
            key = pod_info.uid or pod_info.key
            if key in self._active_items:
                continue
            qpi = self._backoff_pods.pop(key, None) or self._unschedulable.pop(key, None)
            if qpi is not None:
                self._push_active(qpi)


def _scheduling_relevant(pod_info: PodInfo) -> tuple:
    """What of a pending pod can change where it fits: its spec and labels, and the
    annotations the plugins read. Status and the scheduler's own annotations are not."""
    pod = pod_info.pod
    spec = pod.spec.model_dump(exclude_none=True) if pod.spec is not None else {}
    annotations = {
        k: v
        for k, v in pod_info.annotations.items()
        if k not in (GPU_INDICES_ANNOTATION, SCHEDULING_DIAGNOSIS_ANNOTATION)
    }
    return (repr(spec), tuple(sorted(pod_info.labels.items())), tuple(sorted(annotations.items())))
