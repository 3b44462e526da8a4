"""Namespace lifecycle: a deleted namespace is emptied, then released.

The API server marks a deleted Namespace Terminating (its spec.finalizers hold "kubernetes").
This controller deletes every namespaced object in it; once nothing is left it removes its
finalizer through the /finalize subresource and the API server deletes the Namespace.

The decisions are ``decide_contents`` (the namespace and what it still holds in; the deletes
and when to look again out) and ``decide_finalize`` (the body of the /finalize write).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from gpufleet.api.k8s import Namespace
from gpufleet.client.controller import Requeue
from gpufleet.client.errors import NotFound
from gpufleet.controllers.actions import Actions, Delete
from gpufleet.controllers.base import KeyedController

log = logging.getLogger(__name__)

FINALIZER = "kubernetes"
# Graceful pod deletions and finalizers take their time: how soon to look again.
RECHECK_SECONDS = 1.0


def decide_contents(namespace: str, contents: Sequence[tuple[Any, dict[str, Any]]]) -> Actions:
    """Every object (resource type, object) still in the terminating ``namespace`` deleted in
    the background, but those being deleted already; looked at again while any is left."""
    actions = Actions(reason="Empty" if not contents else "Emptying")
    for rt, obj in contents:
        meta = obj.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            continue
        actions.deletes.append(Delete(rt, meta["name"], namespace, propagation_policy="Background"))
    if contents:
        actions.requeue(RECHECK_SECONDS)
    return actions


def decide_finalize(ns: Any) -> dict[str, Any] | None:
    """The Namespace without this controller's finalizer (the body of its /finalize write),
    None when it does not hold it."""
    if ns.spec is None or FINALIZER not in (ns.spec.finalizers or []):
        return None
    body = ns.to_dict()
    body["spec"]["finalizers"] = [f for f in ns.spec.finalizers if f != FINALIZER]
    return body


class NamespaceController(KeyedController):
    name = "namespace"
    model = Namespace

    async def _contents(self, namespace: str) -> list[tuple[Any, dict[str, Any]]]:
        out = []
        for rt in self.client.registry.all():
            if not rt.namespaced or "list" not in rt.verbs or "delete" not in rt.verbs:
                continue
            out.extend((rt, obj) for obj in await self.client.list(rt, namespace, raw=True))
        return out

    async def sync(self, key: str, ns: Any | None) -> Requeue | None:
        if ns is None or ns.metadata.deletion_timestamp is None:
            return None
        name = ns.metadata.name
        contents = await self._contents(name)
        actions = decide_contents(name, contents)
        outcome = await self.act(key, None, actions)
        # A delete answered NotFound: that object was gone already.
        vanished = len(actions.deletes) - len(outcome.deleted) - len(outcome.failed)
        if len(contents) - vanished > 0:
            return self.requeue(actions)
        body = decide_finalize(ns)
        if body is not None:
            try:
                await self.client.raw_request("PUT", f"/api/v1/namespaces/{name}/finalize", json=body)
            except NotFound:
                pass
        return None
