"""The Deployment controller's wiring: which events bring a Deployment back, the snapshot a
sync decides on (``decide.Observed``), and applying the decisions: the new ReplicaSet first
when one is needed, then every other write of the sync."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from gpufleet.api.k8s import Deployment, Pod, ReplicaSet
from gpufleet.client import objects
from gpufleet.client.api import Client
from gpufleet.client.controller import Requeue
from gpufleet.client.errors import AlreadyExists, ApiError, NotFound
from gpufleet.client.events import EventRecorder
from gpufleet.client.informer import NAMESPACE_INDEX, SharedInformerFactory
from gpufleet.controllers._common import (
    CONTROLLER_UID_INDEX,
    RefManager,
    index_by_controller,
    resolve_controller,
    selector_from,
)
from gpufleet.controllers.actions import Actions, Instant
from gpufleet.controllers.base import OwnerController
from gpufleet.controllers.deployment.decide import (
    NEW_RS_TAG,
    Observed,
    decide,
    decide_collision,
    decide_create_failed,
    decide_new_replica_set,
    decide_selecting_all,
    selects_all,
)
from gpufleet.controllers.deployment.model import API_VERSION, KIND, _is_rolling
from gpufleet.utils.clock import REAL_CLOCK, Clock

log = logging.getLogger(__name__)


class DeploymentController(OwnerController):
    name = "deployment"
    kind = KIND
    owner_model = Deployment

    def __init__(
        self,
        client: Client,
        informers: SharedInformerFactory,
        *,
        clock: Clock = REAL_CLOCK,
        recorder: EventRecorder | None = None,
        workers: int = 2,
    ) -> None:
        super().__init__(client, informers, clock=clock, recorder=recorder, workers=workers)
        self.d_informer = self.owners
        self.rs_informer = informers.informer(ReplicaSet)
        self.pod_informer = informers.informer(Pod)
        index_by_controller(self.rs_informer)
        index_by_controller(self.pod_informer)
        self.rs_informer.add_event_handler(self._rs_added, self._rs_updated, self._rs_deleted)
        self.pod_informer.add_event_handler(on_delete=self._pod_deleted)

    # -- events ---------------------------------------------------------------------------

    def _enqueue_matching(self, rs: Any) -> None:
        self.enqueue_matching(rs, lambda d: selector_from(d.spec.selector))

    def _rs_added(self, rs: Any) -> None:
        if objects.controller_ref(rs) is not None:
            self.enqueue_owner(rs)
            return
        self._enqueue_matching(rs)

    def _rs_updated(self, old: Any, new: Any) -> None:
        if objects.resource_version_of(old) == objects.resource_version_of(new):
            return
        old_ref, new_ref = objects.controller_ref(old), objects.controller_ref(new)
        ref_changed = objects.field(old_ref, "uid") != objects.field(new_ref, "uid")
        if ref_changed and old_ref is not None:
            self.enqueue_owner(old)
        if new_ref is not None:
            self.enqueue_owner(new)
            return
        if ref_changed or objects.labels_of(old) != objects.labels_of(new):
            self._enqueue_matching(new)

    def _rs_deleted(self, rs: Any) -> None:
        self.enqueue_owner(rs)

    def _pod_deleted(self, pod: Any) -> None:
        # Recreate waits for the old pods to be gone; nothing else announces that.
        rs = resolve_controller(self.rs_informer, pod, "ReplicaSet")
        if rs is None:
            return
        d = resolve_controller(self.d_informer, rs, KIND)
        if d is not None and not _is_rolling(d):
            self.queue.add(objects.object_key(d))

    # -- sync -----------------------------------------------------------------------------

    async def sync(self, key: str, d: Any) -> Requeue | None:
        if selects_all(d):
            await self.act(key, d, decide_selecting_all(d))
            return None
        now = self.now()
        try:
            obs = await self.observe(d)
            first = decide_new_replica_set(obs)
            if first.creates:
                obs = await self._create_new_replica_set(key, d, obs, first, now)
            actions = decide(obs, now)
            await self.act(key, d, actions)
        except NotFound:
            return None
        except ApiError as e:
            # Mostly a Conflict with a write that the cache has not shown yet: look again.
            log.info("deployment %s: %s", key, e)
            return Requeue()
        return self.requeue(actions)

    async def observe(self, d: Any) -> Observed:
        candidates = self.rs_informer.by_index(NAMESPACE_INDEX, objects.namespace_of(d))
        refs = RefManager(self.client, d, API_VERSION, KIND, selector_from(d.spec.selector), ReplicaSet)
        rss = await refs.claim(candidates)
        pods = {objects.uid_of(rs): self.pod_informer.by_index(CONTROLLER_UID_INDEX, objects.uid_of(rs))
                for rs in rss}
        return Observed(d, rss, pods)

    async def _create_new_replica_set(self, key: str, d: Any, obs: Observed, first: Actions,
                                      now: Instant) -> Observed:
        """Create the new set; its answer (or the same set found existing) is the new set the
        rest of the sync works on. A name taken by another template, or a refused create, is
        written down and raised."""
        name = first.creates[0].body["metadata"]["name"]
        try:
            outcome = await self.act(key, d, first)
        except AlreadyExists:
            # A slow cache, or a hash collision with a different template.
            found = await self.client.get(ReplicaSet, name, objects.namespace_of(d))
            collision = decide_collision(d, found)
            if collision is not None:
                await self.act(key, d, collision)
                raise
            return dataclasses.replace(obs, created=found, fresh=False)
        except ApiError as e:
            await self.act(key, d, decide_create_failed(d, name, e, now))
            raise
        return dataclasses.replace(obs, created=ReplicaSet.from_dict(outcome.answers[NEW_RS_TAG]), fresh=True)
