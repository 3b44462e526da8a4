"""The CronJob controller's wiring: Job events bring their CronJob back, a sync observes (the
Jobs it controls; active Jobs the cache lacks are asked of the API), decides (``decide``) and
applies: deletes and the create first, then the events and the status naming the Job made."""

from __future__ import annotations

import logging
from typing import Any

from gpufleet.api.k8s import CronJob, Job
from gpufleet.client import objects
from gpufleet.client.api import Client
from gpufleet.client.controller import Requeue
from gpufleet.client.errors import ApiError, NotFound
from gpufleet.client.informer import SharedInformerFactory
from gpufleet.controllers._common import CONTROLLER_UID_INDEX, index_by_controller, status_dict
from gpufleet.controllers.actions import Actions
from gpufleet.controllers.base import OwnerController
from gpufleet.controllers.cronjob.decide import KIND, Observed, after_create, decide

log = logging.getLogger(__name__)


def _rv(obj: Any) -> int:
    try:
        return int(objects.resource_version_of(obj))
    except (TypeError, ValueError):
        return 0


class CronJobController(OwnerController):
    name = "cronjob"
    kind = KIND
    owner_model = CronJob

    def __init__(self, client: Client, informers: SharedInformerFactory, **kwargs: Any) -> None:
        super().__init__(client, informers, **kwargs)
        self.job_informer = informers.informer(Job)
        index_by_controller(self.job_informer)
        self.job_informer.add_event_handler(self._job_changed, self._job_updated, self._job_changed)
        # CronJob key -> resourceVersion of this controller's last status write: a cached
        # CronJob older than that would not list the Job it just made as active.
        self._written: dict[str, int] = {}

    def _job_changed(self, job: Any) -> None:
        self.enqueue_owner(job)

    def _job_updated(self, old: Any, new: Any) -> None:
        self.enqueue_old_owner(old, new)
        self.enqueue_owner(new)

    def forget(self, key: str) -> None:
        self._written.pop(key, None)

    async def observe(self, cronjob: Any) -> Observed:
        jobs = [j for j in self.job_informer.by_index(CONTROLLER_UID_INDEX, objects.uid_of(cronjob))
                if objects.field(objects.controller_ref(j), "kind") == KIND]
        cached = {objects.uid_of(j) for j in jobs}
        missing: set[str] = set()
        for ref in status_dict(cronjob).get("active") or []:
            if ref.get("uid") in cached:
                continue
            # The cache may not show a Job made a moment ago: ask the API before calling it gone.
            try:
                found = await self.client.get(Job, ref.get("name", ""), ref.get("namespace") or
                                              objects.namespace_of(cronjob), raw=True)
            except NotFound:
                missing.add(ref.get("uid", ""))
                continue
            if (found.get("metadata") or {}).get("uid") != ref.get("uid"):
                missing.add(ref.get("uid", ""))
        return Observed(cronjob, jobs, frozenset(missing))

    async def sync(self, key: str, cronjob: Any) -> Requeue | None:
        if _rv(cronjob) < self._written.get(key, 0):
            return None  # the watch event of that write brings it back
        try:
            return await self._sync(key, cronjob)
        except ApiError as e:
            return self.retry_later(key, e)

    async def _sync(self, key: str, cronjob: Any) -> Requeue | None:
        plan = decide(await self.observe(cronjob), self.now().wall)
        first = Actions(deletes=plan.deletes, creates=[plan.create] if plan.create else [], events=plan.events,
                        reason=plan.reason)
        try:
            outcome = await self.act(key, cronjob, first, raise_errors=False)
        except ApiError as e:
            if plan.create is not None:
                await self.recorder.record(cronjob, "Warning", "FailedCreate", f"Error creating job: {e}")
            raise
        job: dict[str, Any] | None = None
        created = False
        if plan.create is not None:
            if "job" in outcome.answers:
                job, created = outcome.answers["job"], True
            else:
                # It was there already (a crash between the create and the status write, or
                # someone else): it counts only when it is this CronJob's.
                meta = plan.create.body["metadata"]
                job = await self.client.get(Job, meta["name"], meta["namespace"], raw=True)
                if objects.field(objects.controller_ref(job), "uid") != objects.uid_of(cronjob):
                    job = None
        second = after_create(cronjob, plan, outcome.deleted, job, created)
        written = await self.act(key, cronjob, second)
        if written.owner is not None:
            self._written[key] = _rv(written.owner)
        if outcome.error is not None:
            raise outcome.error
        return self.requeue(second)
