"""The DaemonSet controller's wiring: nodes, pods and revisions bring a set back; a sync
observes (``decide.Observed``), decides and applies."""

from __future__ import annotations

import logging
from typing import Any

from gpufleet.api.k8s import ControllerRevision, DaemonSet, Node, Pod
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
from gpufleet.controllers.daemonset.decide import Observed, decide
from gpufleet.controllers.daemonset.model import API_VERSION, KIND, target_node

log = logging.getLogger(__name__)


def _node_shape(node: Any) -> tuple:
    """What decides where daemons run: labels, taints, the name-pinning spec fields."""
    spec = node.spec
    taints = tuple(sorted((t.key, t.value or "", t.effect) for t in (spec.taints if spec else None) or []))
    return (tuple(sorted((objects.labels_of(node) or {}).items())), taints)


class DaemonSetController(OwnerController):
    name = "daemonset"
    kind = KIND
    owner_model = DaemonSet

    def __init__(self, client: Client, informers: SharedInformerFactory, **kwargs: Any) -> None:
        super().__init__(client, informers, **kwargs)
        self.pod_informer = informers.informer(Pod)
        self.node_informer = informers.informer(Node)
        self.revision_informer = informers.informer(ControllerRevision)
        index_by_controller(self.pod_informer)
        index_by_controller(self.revision_informer)
        self.pod_informer.add_event_handler(self._pod_added, self._pod_updated, self.child_deleted)
        self.node_informer.add_event_handler(self._node_changed, self._node_updated, self._node_changed)
        self.revision_informer.add_event_handler(self._revision_changed, lambda old, new: self._revision_changed(new),
                                                 self._revision_changed)
        self.backoff: dict[str, dict[str, tuple[float, float]]] = {}

    # -- events ---------------------------------------------------------------------------

    def _enqueue_all(self) -> None:
        for ds in self.owners.list():
            self.queue.add(objects.object_key(ds))

    def _node_changed(self, node: Any) -> None:
        self._enqueue_all()

    def _node_updated(self, old: Any, new: Any) -> None:
        if _node_shape(old) != _node_shape(new):
            self._enqueue_all()

    def _revision_changed(self, revision: Any) -> None:
        if objects.controller_ref(revision) is not None:
            self.enqueue_owner(revision)

    def _pod_added(self, pod: Any) -> None:
        self.child_added(pod, lambda ds: selector_from(ds.spec.selector))

    def _pod_updated(self, old: Any, new: Any) -> None:
        self.child_updated(old, new, lambda ds: selector_from(ds.spec.selector))

    # -- sync -----------------------------------------------------------------------------

    def forget(self, key: str) -> None:
        self.backoff.pop(key, None)

    async def observe(self, key: str, ds: Any) -> Observed:
        ns = objects.namespace_of(ds)
        selector = selector_from(ds.spec.selector)
        pod_refs = RefManager(self.client, ds, API_VERSION, KIND, selector, Pod)
        pods = await pod_refs.claim(self.pod_informer.by_index(NAMESPACE_INDEX, ns),
                                    adopt_filter=lambda p: not pod_is_terminal(p))
        by_node: dict[str, list[Any]] = {}
        for p in pods:
            node = target_node(p)
            if node:
                by_node.setdefault(node, []).append(p)
        rev_refs = RefManager(self.client, ds, API_VERSION, KIND, selector, ControllerRevision)
        revisions = await rev_refs.claim(self.revision_informer.by_index(NAMESPACE_INDEX, ns))
        return Observed(ds, self.node_informer.list(), by_node, revisions, self.expectations.satisfied(key),
                        dict(self.backoff.get(key, {})))

    async def sync(self, key: str, ds: Any) -> Requeue | None:
        try:
            obs = await self.observe(key, ds)
        except ApiError as e:
            log.info("daemonset %s: adopting or releasing failed: %s", key, e)
            return Requeue()
        actions = decide(obs, self.now())
        if "backoff" in actions.memo:
            self.backoff[key] = actions.memo["backoff"]
        try:
            outcome = await self.act(key, ds, actions, raise_errors=False)
        except ApiError as e:
            return self.retry_later(key, e)
        if outcome.error is not None:
            log.info("daemonset %s: %s", key, error_text(outcome.error))
            return Requeue()
        return self.requeue(actions)
