"""The node's half of the local-path provisioner: when a volume that lives on this node is
deleted, remove its directory, then let the volume go.

The provisioner (gpufleet/controllers/localpath.py) puts the finalizer
``gpufleet.io/local-path-cleanup`` on every volume it makes and labels it with its node; the
control plane cannot reach the node's disk, so the deletion of such a volume waits here.
This watches the volumes labelled for this node (the only ones the Node authorizer lets a
node list) and, for one being deleted whose only finalizer left is this one (so nothing
still protects it: a Bound volume keeps ``kubernetes.io/pv-protection``), whose node
affinity names this node:

- removes its directory, but only a directory that is exactly what the provisioner makes:
  a direct child of its class's ``nodePath`` named ``<volume>_<namespace>_<claim>``;
  anything else (a volume written by hand, a class since deleted, a symlink out of the
  tree) is left in place and said so in a Warning event on the volume;
- then removes the finalizer (a compare-and-swap update), which lets the API server delete it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from collections.abc import Hashable
from typing import Any

from gpufleet.api import storage
from gpufleet.client import Client, EventRecorder, Informer, NotFound
from gpufleet.client.controller import Controller, Requeue, TemporaryError
from gpufleet.client.errors import Conflict
from gpufleet.client.events import WARNING
from gpufleet.client.workqueue import WorkQueue
from gpufleet.utils.clock import REAL_CLOCK, Clock

log = logging.getLogger(__name__)

NAME = "local-path-cleanup"
# How long to wait before trying again to remove a directory the filesystem refused.
RETRY_DELAY = 5.0


def check_directory(pv: dict[str, Any], node_path: str) -> str | None:
    """Why ``pv``'s directory must not be removed (None: it may). Pure but for reading links."""
    name = (pv.get("metadata") or {}).get("name") or ""
    path = storage.volume_path(pv).rstrip("/")
    if not path:
        return "the volume names no hostPath or local directory"
    root = os.path.realpath(node_path)
    base = os.path.basename(path)
    if os.path.realpath(os.path.dirname(path)) != root or not storage.looks_provisioned(name, base):
        return f"{path} is not a directory the local-path provisioner made under the class's nodePath {node_path}"
    if os.path.islink(path) and os.path.realpath(path) != os.path.join(root, base):
        return f"{path} is a link out of {node_path}"
    return None


class LocalPathCleanup:
    """``LocalPathCleanup(client, node_name, clock)``; ``await start()`` ... ``await stop()``."""

    def __init__(
        self,
        client: Client,
        node_name: str,
        clock: Clock = REAL_CLOCK,
        *,
        recorder: EventRecorder | None = None,
        backoff_initial: float = 0.2,
        backoff_max: float = 5.0,
    ) -> None:
        self.client = client
        self.node_name = node_name
        self.clock = clock
        self.recorder = recorder or EventRecorder(client, "gpufleet-agent", host=node_name, clock=clock)
        self.informer = Informer(client, "persistentvolumes",
                                 label_selector={storage.LOCAL_PATH_NODE_LABEL: node_name}, raw=True, clock=clock,
                                 backoff_initial=backoff_initial, backoff_max=backoff_max)
        self.queue = WorkQueue(NAME, clock=clock)
        self.controller = Controller(NAME, self.reconcile, self.queue)
        self.informer.add_event_handler(self._changed, lambda old, new: self._changed(new))

    async def start(self) -> None:
        await self.informer.start()
        await self.controller.start()

    async def stop(self) -> None:
        await self.controller.stop()
        await self.informer.stop()

    def _changed(self, pv: dict[str, Any]) -> None:
        name = (pv.get("metadata") or {}).get("name")
        if name:
            self.queue.add(name)

    async def reconcile(self, key: Hashable) -> Requeue | None:
        pv = self.informer.get(str(key))
        if pv is None:
            return None
        meta = pv.get("metadata") or {}
        finalizers = list(meta.get("finalizers") or [])
        if not meta.get("deletionTimestamp") or finalizers != [storage.LOCAL_PATH_CLEANUP_FINALIZER]:
            return None
        if not storage.pinned_to(pv, self.node_name):
            return None
        left = await self._remove_directory(pv)
        if left:
            log.warning("local-path cleanup of %s: %s", key, left)
            await self.recorder.record(pv, WARNING, "VolumeFailedDelete",
                                       f"the volume's directory was left on node {self.node_name}: {left}")
        body = dict(pv)
        body["metadata"] = {**meta, "finalizers": [f for f in finalizers if f != storage.LOCAL_PATH_CLEANUP_FINALIZER]}
        try:
            await self.client.update(body, raw=True)
        except NotFound:
            return None
        except Conflict:
            return Requeue()
        return None

    async def _remove_directory(self, pv: dict[str, Any]) -> str | None:
        """Remove the volume's directory; what was left instead, and why, or None."""
        class_name = storage.volume_class(pv)
        try:
            sc = await self.client.get("storageclasses", class_name, raw=True) if class_name else None
        except NotFound:
            sc = None
        if sc is None:
            return f'storage class "{class_name}" not found, so where its volumes live is unknown'
        node_path = storage.node_path(sc)
        why = check_directory(pv, node_path)
        if why is not None:
            return why
        path = storage.volume_path(pv).rstrip("/")
        try:
            await asyncio.to_thread(_remove, path)
        except OSError as exc:
            raise TemporaryError(f"removing {path}: {exc}", delay=RETRY_DELAY) from exc
        log.info("local-path cleanup: removed %s", path)
        return None


def _remove(path: str) -> None:
    if os.path.islink(path) or os.path.isfile(path):
        os.unlink(path)
    elif os.path.isdir(path):
        shutil.rmtree(path)
