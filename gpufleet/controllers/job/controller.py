"""The Job controller's wiring: which pod events bring a Job back, what it remembers between
syncs (back-offs, finalizers it removed, its last status write), pods whose Job is gone, and
applying each step of the decision (``decide``)."""

from __future__ import annotations

import logging
from typing import Any

from gpufleet.api.k8s import Job, Pod
from gpufleet.client import objects
from gpufleet.client.api import Client, retry_on_conflict
from gpufleet.client.controller import Controller, Requeue
from gpufleet.client.errors import ApiError, NotFound
from gpufleet.client.informer import NAMESPACE_INDEX, SharedInformerFactory
from gpufleet.client.workqueue import WorkQueue
from gpufleet.controllers._common import (
    CONTROLLER_UID_INDEX,
    RefManager,
    index_by_controller,
    is_being_deleted,
    selector_from,
)
from gpufleet.controllers.actions import Actions
from gpufleet.controllers.base import OwnerController
from gpufleet.controllers.job.decide import (
    Backoff,
    Observed,
    Settings,
    begin,
    decide_expire,
    decide_finish,
    decide_pods,
    decide_tracking,
    finished_pods_to_release,
)
from gpufleet.controllers.job.model import (
    API_VERSION,
    KIND,
    TRACKING_FINALIZER,
    has_tracking_finalizer,
    is_finished,
    job_selector,
    resource_version,
)

log = logging.getLogger(__name__)


class JobController(OwnerController):
    name = "job"
    kind = KIND
    owner_model = Job
    settings_type = Settings  # pod_failure_backoff, pod_failure_backoff_max

    def __init__(self, client: Client, informers: SharedInformerFactory, **kwargs: Any) -> None:
        super().__init__(client, informers, **kwargs)
        # Job key -> uids of pods whose finalizer this controller removed but whose update
        # the informer has not shown yet; they must not be counted again meanwhile.
        self._finalizers_removed: dict[str, set[str]] = {}
        self._backoff: dict[str, Backoff] = {}
        # Job key -> resourceVersion of this controller's last status write: a cached Job
        # older than that would make it count and create from stale numbers.
        self._written: dict[str, int] = {}
        self.job_informer = self.owners
        self.pod_informer = informers.informer(Pod)
        index_by_controller(self.pod_informer)
        self.pod_informer.add_event_handler(self._pod_added, self._pod_updated, self._pod_deleted)
        # Pods holding the tracking finalizer whose Job is gone must still be let go.
        self.orphan_queue = WorkQueue(f"{self.name}-orphan-pods", clock=self.clock)
        self.orphans = Controller(f"{self.name}-orphan-pods", self._release_orphan, self.orphan_queue, workers=1)

    async def start(self) -> None:
        await super().start()
        await self.orphans.start()

    async def stop(self) -> None:
        await self.orphans.stop()
        await super().stop()

    # -- pod events -----------------------------------------------------------------------

    def _batched(self, key: str) -> None:
        """Sync ``key`` once the batch period is over (at once when it is 0)."""
        self.queue.add_after(key, self.settings.sync_batch_period)

    def update_matters(self, old: Any, new: Any) -> bool:
        """A spec change (a new generation: unsuspended, resized) is synced at once; any other
        update of the Job (its status, written by this controller as its pods move) is batched,
        as upstream's updateJob does."""
        if objects.meta(old, "generation") != objects.meta(new, "generation"):
            return True
        self._batched(objects.object_key(new))
        return False

    def _pod_added(self, pod: Any) -> None:
        if is_being_deleted(pod):
            self._pod_updated(pod, pod)
            return
        key = self.owner_key(pod)
        if key:
            self.expectations.creation_observed(key)
            self._batched(key)
        elif objects.controller_ref(pod) is None:
            self._enqueue_matching(pod)
        else:
            self._maybe_orphan(pod)

    def _pod_updated(self, old: Any, new: Any) -> None:
        key = self.owner_key(new)
        if key:
            if is_being_deleted(new):
                self.expectations.deletion_observed(key, objects.object_key(new))
            self._batched(key)
        else:
            self._maybe_orphan(new)
        old_key = self.owner_key(old)
        if old_key and old_key != key:
            self._batched(old_key)
        if objects.controller_ref(new) is None and objects.labels_of(old) != objects.labels_of(new):
            self._enqueue_matching(new)

    def _pod_deleted(self, pod: Any) -> None:
        key = self.owner_key(pod)
        if key:
            self.expectations.deletion_observed(key, objects.object_key(pod))
            self._batched(key)

    def _enqueue_matching(self, pod: Any) -> None:
        self.enqueue_matching(pod, lambda job: selector_from(job_selector(job)))

    def _maybe_orphan(self, pod: Any) -> None:
        if has_tracking_finalizer(pod):
            self.orphan_queue.add(objects.object_key(pod))

    # -- sync -----------------------------------------------------------------------------

    def forget(self, key: str) -> None:
        self._finalizers_removed.pop(key, None)
        self._backoff.pop(key, None)
        self._written.pop(key, None)

    async def sync(self, key: str, job: Any) -> Requeue | None:
        if resource_version(job) < self._written.get(key, 0):
            return None  # the watch event of that write will bring us back
        try:
            return await self._sync(key, job)
        except ApiError as e:
            return self.retry_later(key, e)

    async def _claim_pods(self, job: Any) -> list[Any]:
        def drop_finalizer(body: dict[str, Any]) -> None:
            meta = body["metadata"]
            meta["finalizers"] = [f for f in meta.get("finalizers") or [] if f != TRACKING_FINALIZER] or None

        refs = RefManager(self.client, job, API_VERSION, KIND, selector_from(job_selector(job)), Pod,
                          release_also=drop_finalizer)
        candidates = self.pod_informer.by_index(NAMESPACE_INDEX, objects.namespace_of(job))
        return await refs.claim(candidates, adopt_filter=lambda p: not is_finished(job))

    def observe(self, key: str, job: Any, pods: list[Any]) -> Observed:
        removed = self._finalizers_removed.setdefault(key, set())
        # A removal is settled once the cache shows the pod without the finalizer, or gone.
        mine = {objects.uid_of(p): p for p in self.pod_informer.by_index(CONTROLLER_UID_INDEX, objects.uid_of(job))}
        for uid in list(removed):
            if uid not in mine or not has_tracking_finalizer(mine[uid]):
                removed.discard(uid)
        return Observed(job, pods, frozenset(removed), self.expectations.satisfied(key),
                        self._backoff.get(key, Backoff()), self.settings)

    async def _sync(self, key: str, job: Any) -> Requeue | None:
        now = self.now()
        if is_finished(job):
            mine = self.pod_informer.by_index(CONTROLLER_UID_INDEX, objects.uid_of(job))
            await self._release(key, finished_pods_to_release(job, mine))
            return await self._expire(key, job)

        sync = begin(self.observe(key, job, await self._claim_pods(job)), now)
        self._backoff[key] = sync.backoff

        pods = decide_pods(sync, now)
        outcome = await self.act(key, job, pods, raise_errors=False)
        active = sync.active + len(outcome.created) - (len(pods.deletes) - len(outcome.failed))
        if outcome.error is not None and (pods.creates or len(outcome.failed) == len(pods.deletes)):
            raise outcome.error

        tracking = decide_tracking(sync, active, now)
        job = await self._write(key, job, tracking)
        released = await self._release(key, sync.to_release)

        finish = decide_finish(sync, job, released, now)
        job = await self._write(key, job, finish)
        if is_finished(job) and job.spec.ttl_seconds_after_finished is not None:
            return await self._expire(key, job)
        finish.requeue(pods.requeue_after)  # a pod back-off still running: back when it ends
        return self.requeue(finish)

    async def _write(self, key: str, job: Any, actions: Actions) -> Any:
        """Apply ``actions``; the Job as its status write answered (``job`` when none)."""
        outcome = await self.act(key, job, actions)
        if outcome.owner is None:
            return job
        updated = Job.from_dict(outcome.owner)
        self._written[key] = resource_version(updated)
        return updated

    async def _expire(self, key: str, job: Any) -> Requeue | None:
        actions = decide_expire(job, self.now())
        await self.act(key, job, actions)
        return self.requeue(actions)

    async def _release(self, key: str, pods: list[Any]) -> set[str]:
        """Take the tracking finalizer off ``pods``; the uids where it is off (or the pod gone)."""
        removed = self._finalizers_removed.setdefault(key, set())
        released: set[str] = set()
        for pod in pods:
            uid = objects.uid_of(pod)
            removed.add(uid)
            try:
                await _drop_tracking_finalizer(self.client, pod)
            except ApiError as e:
                removed.discard(uid)
                log.info("job %s: could not remove the finalizer of pod %s: %s", key, objects.name_of(pod), e)
                continue
            released.add(uid)
        return released

    async def _release_orphan(self, key: str) -> None:
        """A pod holding the tracking finalizer whose Job is gone (or finished) is let go."""
        pod = self.pod_informer.get(key)
        if pod is None or not has_tracking_finalizer(pod):
            return
        ref = objects.controller_ref(pod)
        if ref is not None and objects.field(ref, "kind") == KIND:
            try:
                job = await self.client.get(Job, objects.field(ref, "name"), objects.namespace_of(pod))
            except NotFound:
                job = None
            if job is not None and objects.uid_of(job) == objects.field(ref, "uid") and not is_finished(job):
                return
        try:
            await _drop_tracking_finalizer(self.client, pod)
        except NotFound:
            pass


async def _drop_tracking_finalizer(client: Client, pod: Any) -> None:
    uid = objects.uid_of(pod)

    async def attempt() -> None:
        try:
            fresh = await client.get(Pod, objects.name_of(pod), objects.namespace_of(pod), raw=True)
        except NotFound:
            return
        meta = fresh["metadata"]
        finalizers = meta.get("finalizers") or []
        if meta.get("uid") != uid or TRACKING_FINALIZER not in finalizers:
            return
        meta["finalizers"] = [f for f in finalizers if f != TRACKING_FINALIZER]
        try:
            await client.update(fresh, raw=True)
        except NotFound:
            return

    await retry_on_conflict(attempt)
