"""Namespace lifecycle: a deleted namespace is emptied, then released.

The API server marks a deleted Namespace Terminating (its spec.finalizers hold "kubernetes").
This controller deletes every namespaced object in it; once nothing is left it removes its
finalizer through the /finalize subresource and the API server deletes the Namespace.
"""

from __future__ import annotations

import logging

from gpufleet.api.k8s import Namespace
from gpufleet.client.api import Client
from gpufleet.client.controller import Controller, Requeue
from gpufleet.client.errors import NotFound
from gpufleet.client.informer import SharedInformerFactory

log = logging.getLogger(__name__)

FINALIZER = "kubernetes"


class NamespaceController:
    def __init__(self, client: Client, informers: SharedInformerFactory) -> None:
        self.client = client
        self.informer = informers.informer(Namespace)
        self.controller = Controller("namespace", self.reconcile, workers=2)
        self.controller.watch(self.informer)

    async def start(self) -> None:
        await self.controller.start()

    async def stop(self) -> None:
        await self.controller.stop()

    async def reconcile(self, key: str) -> Requeue | None:
        ns = self.informer.get(key)
        if ns is None or ns.metadata.deletion_timestamp is None:
            return None
        name = ns.metadata.name
        remaining = 0
        for rt in self.client.registry.all():
            if not rt.namespaced or "list" not in rt.verbs or "delete" not in rt.verbs:
                continue
            items = await self.client.list(rt, name, raw=True)
            for obj in items:
                remaining += 1
                if obj["metadata"].get("deletionTimestamp"):
                    continue
                try:
                    await self.client.delete(rt, obj["metadata"]["name"], name, propagation_policy="Background")
                except NotFound:
                    remaining -= 1
        if remaining:
            # Graceful pod deletions and finalizers take their time; look again shortly.
            return Requeue(after=1.0)
        finalizers = [f for f in (ns.spec.finalizers or []) if f != FINALIZER] if ns.spec else []
        if ns.spec and FINALIZER in (ns.spec.finalizers or []):
            body = ns.to_dict()
            body["spec"]["finalizers"] = finalizers
            try:
                await self.client.raw_request("PUT", f"/api/v1/namespaces/{name}/finalize", json=body)
            except NotFound:
                pass
        return None
