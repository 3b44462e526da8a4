"""Runs a reconcile(key) function over a work queue with N workers.

Informer callbacks only turn objects into keys and enqueue them; workers take keys and call
reconcile, which re-reads the world and acts. What reconcile returns or raises decides what
happens to the key next (kopf's outcomes on client-go's queue):

* returns None            -> done; the key's failure count is reset;
* returns Requeue(after)  -> run again after ``after`` seconds (rate-limited when None);
* raises TemporaryError   -> run again after its ``delay``;
* raises PermanentError   -> logged and dropped until the object changes again;
* raises anything else    -> logged with its traceback and retried with per-key back-off.

No outcome stops the workers: one broken object must not stall every other one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any

from gpufleet.client import objects
from gpufleet.client.workqueue import ShutDown, WorkQueue

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Requeue:
    """Returned by reconcile to be called again: after ``after`` seconds, or with the
    queue's back-off when None (for "not yet" rather than "failed")."""

    after: float | None = None


class TemporaryError(Exception):
    """Retry this key after ``delay`` seconds; the condition is expected to clear."""

    def __init__(self, message: str = "", delay: float = 60.0) -> None:
        super().__init__(message)
        self.delay = delay


class PermanentError(Exception):
    """Retrying this key cannot help until its object changes; log it and move on."""


Reconcile = Callable[[Hashable], Awaitable["Requeue | None"]]


class Controller:
    def __init__(
        self,
        name: str,
        reconcile: Reconcile,
        queue: WorkQueue | None = None,
        *,
        workers: int = 1,
    ) -> None:
        self.name = name
        self.reconcile = reconcile
        self.queue = queue if queue is not None else WorkQueue(name)
        self.workers = workers
        self._tasks: list[asyncio.Task[None]] = []
        self._logger = logging.getLogger(f"{__name__}.{name}")

    # -- feeding the queue --------------------------------------------------------------

    def enqueue(self, key: Hashable) -> None:
        self.queue.add(key)

    def enqueue_after(self, key: Hashable, delay: float) -> None:
        self.queue.add_after(key, delay)

    def enqueue_object(self, obj: Any) -> None:
        enqueue_object(self.queue, obj)

    def enqueue_owner(self, obj: Any, kind: str | None = None, api_version: str | None = None) -> None:
        enqueue_owner(self.queue, obj, kind=kind, api_version=api_version)

    def watch(
        self, informer: Any, *, owner_kind: str | None = None, owner_api_version: str | None = None,
        update_matters: Callable[[Any, Any], bool] | None = None,
    ) -> None:
        """Enqueue from an informer's events: the object's own key, or with ``owner_kind``
        the key of its controlling owner of that kind (a ReplicaSet controller watches Pods).
        ``update_matters(old, new)``: an update it says False to enqueues nothing."""
        if owner_kind is None:
            enqueue = self.enqueue_object
        else:

            def enqueue(obj: Any) -> None:
                self.enqueue_owner(obj, owner_kind, owner_api_version)

        def on_update(old: Any, new: Any) -> None:
            if update_matters is not None and old is not None and not update_matters(old, new):
                return
            enqueue(new)
            # An object that changed owners must wake its old owner too.
            if owner_kind is not None and old is not None:
                old_ref = objects.controller_ref(old)
                new_ref = objects.controller_ref(new)
                if old_ref is not None and objects.field(old_ref, "uid") != objects.field(new_ref, "uid"):
                    enqueue(old)

        informer.add_event_handler(on_add=enqueue, on_update=on_update, on_delete=enqueue)

    # -- running ------------------------------------------------------------------------

    async def start(self) -> None:
        if self._tasks:
            return
        self._tasks = [
            asyncio.create_task(self._worker(), name=f"controller:{self.name}:{i}")
            for i in range(self.workers)
        ]

    async def run(self) -> None:
        """Start and block until the queue shuts down (or the caller is cancelled)."""
        await self.start()
        try:
            await asyncio.gather(*self._tasks)
        finally:
            await self.stop()

    async def stop(self, *, drain: bool = False) -> None:
        """Shut the queue down; with drain=True let in-flight reconciles finish first."""
        if drain:
            await self.queue.shutdown_with_drain()
        else:
            self.queue.shutdown()
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            if not drain:
                task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _worker(self) -> None:
        while True:
            try:
                key = await self.queue.get()
            except ShutDown:
                return
            try:
                await self.process(key)
            finally:
                self.queue.done(key)

    async def process(self, key: Hashable) -> None:
        """Run reconcile for one key and act on the outcome (the queue's done() is the caller's)."""
        try:
            result = await self.reconcile(key)
        except asyncio.CancelledError:
            raise
        except TemporaryError as exc:
            self._logger.info("%s: temporary error, retrying in %.3gs: %s", key, exc.delay, exc)
            self.queue.add_after(key, exc.delay)
        except PermanentError as exc:
            self._logger.error("%s: permanent error, not retrying: %s", key, exc)
            self.queue.forget(key)
        except Exception:
            self._logger.exception("%s: reconcile failed (retry %d)", key, self.queue.num_requeues(key) + 1)
            self.queue.add_rate_limited(key)
        else:
            if isinstance(result, Requeue):
                if result.after is None:
                    self.queue.add_rate_limited(key)
                else:
                    self.queue.forget(key)
                    self.queue.add_after(key, result.after)
            else:
                self.queue.forget(key)


def enqueue_object(queue: WorkQueue, obj: Any) -> None:
    """Enqueue the object's 'namespace/name' key."""
    key = objects.object_key(obj)
    if key:
        queue.add(key)


def owner_key(obj: Any, kind: str | None = None, api_version: str | None = None) -> str | None:
    """The key of the object's controlling owner (ownerReferences with controller=true),
    when there is one and it is of ``kind`` / ``api_version`` if given. Owners live in the
    object's namespace (or are cluster-scoped when the object is)."""
    ref = objects.controller_ref(obj)
    if ref is None:
        return None
    if kind is not None and objects.field(ref, "kind") != kind:
        return None
    if api_version is not None and objects.field(ref, "apiVersion") != api_version:
        return None
    name = objects.field(ref, "name")
    if not name:
        return None
    ns = objects.namespace_of(obj)
    return f"{ns}/{name}" if ns else name


def enqueue_owner(
    queue: WorkQueue, obj: Any, *, kind: str | None = None, api_version: str | None = None
) -> None:
    key = owner_key(obj, kind, api_version)
    if key:
        queue.add(key)
