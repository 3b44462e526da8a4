"""The StatefulSet controller's wiring: the events that bring a set back, the snapshot a sync
decides on (``decide.Observed``) and applying the decision."""

from __future__ import annotations

import logging
from typing import Any

from gpufleet.api.k8s import ControllerRevision, PersistentVolumeClaim, Pod, StatefulSet
from gpufleet.client import objects
from gpufleet.client.api import Client
from gpufleet.client.controller import Requeue
from gpufleet.client.errors import ApiError
from gpufleet.client.informer import NAMESPACE_INDEX, SharedInformerFactory
from gpufleet.controllers._common import (
    RefManager,
    error_text,
    index_by_controller,
    pod_is_terminal,
    selector_from,
)
from gpufleet.controllers.base import OwnerController
from gpufleet.controllers.statefulset.decide import Observed, decide
from gpufleet.controllers.statefulset.model import API_VERSION, KIND, ordinal_of

log = logging.getLogger(__name__)


class StatefulSetController(OwnerController):
    name = "statefulset"
    kind = KIND
    owner_model = StatefulSet

    def __init__(self, client: Client, informers: SharedInformerFactory, **kwargs: Any) -> None:
        super().__init__(client, informers, **kwargs)
        self.pod_informer = informers.informer(Pod)
        self.claim_informer = informers.informer(PersistentVolumeClaim)
        self.revision_informer = informers.informer(ControllerRevision)
        index_by_controller(self.pod_informer)
        index_by_controller(self.revision_informer)
        self.pod_informer.add_event_handler(self._pod_added, self._pod_updated, self.child_deleted)
        self.revision_informer.add_event_handler(self._revision_changed, lambda old, new: self._revision_changed(new),
                                                 self._revision_changed)
        self.claim_informer.add_event_handler(self._claim_changed, lambda old, new: self._claim_changed(new),
                                              self._claim_changed)

    # -- events ---------------------------------------------------------------------------

    def _pod_added(self, pod: Any) -> None:
        self.child_added(pod, lambda sts: selector_from(sts.spec.selector))

    def _pod_updated(self, old: Any, new: Any) -> None:
        self.child_updated(old, new, lambda sts: selector_from(sts.spec.selector))

    def _revision_changed(self, revision: Any) -> None:
        if objects.controller_ref(revision) is not None:
            self.enqueue_owner(revision)

    def _claim_changed(self, claim: Any) -> None:
        # A replica waits for a claim of its own that is being deleted to be gone.
        name = objects.name_of(claim)
        for sts in self.owners.by_index(NAMESPACE_INDEX, objects.namespace_of(claim)):
            for tpl in sts.spec.volume_claim_templates or []:
                if tpl.metadata is not None and name.startswith(f"{tpl.metadata.name}-{objects.name_of(sts)}-"):
                    self.queue.add(objects.object_key(sts))

    # -- sync -----------------------------------------------------------------------------

    async def observe(self, key: str, sts: Any) -> Observed:
        ns = objects.namespace_of(sts)
        selector = selector_from(sts.spec.selector)
        pod_refs = RefManager(self.client, sts, API_VERSION, KIND, selector, Pod)
        pods = await pod_refs.claim(self.pod_informer.by_index(NAMESPACE_INDEX, ns),
                                    adopt_filter=lambda p: ordinal_of(sts, p) is not None and not pod_is_terminal(p))
        rev_refs = RefManager(self.client, sts, API_VERSION, KIND, selector, ControllerRevision)
        revisions = await rev_refs.claim(self.revision_informer.by_index(NAMESPACE_INDEX, ns))
        claims = {objects.name_of(c): c for c in self.claim_informer.by_index(NAMESPACE_INDEX, ns)}
        return Observed(sts, pods, claims, revisions, self.expectations.satisfied(key))

    async def sync(self, key: str, sts: Any) -> Requeue | None:
        try:
            obs = await self.observe(key, sts)
        except ApiError as e:
            log.info("statefulset %s: adopting or releasing failed: %s", key, e)
            return Requeue()
        actions = decide(obs, self.now())
        try:
            outcome = await self.act(key, sts, actions, raise_errors=False)
        except ApiError as e:
            return self.retry_later(key, e)
        if outcome.error is not None:
            log.info("statefulset %s: %s", key, error_text(outcome.error))
            return Requeue()
        return self.requeue(actions)
