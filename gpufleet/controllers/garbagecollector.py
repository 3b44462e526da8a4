"""Garbage collection through ownerReferences, as Kubernetes' garbage collector does it.

- An object all of whose owners are gone (no object with the owner's uid exists) is deleted,
  with the propagation its own finalizers ask for (background by default).
- Foreground deletion: an owner being deleted with the ``foregroundDeletion`` finalizer
  first has its dependents deleted (a dependent with dependents of its own is itself deleted
  in the foreground); once no dependent with ``blockOwnerDeletion`` is left, the finalizer is
  removed and the API server lets the owner go.
- Orphaning: an owner being deleted with the ``orphan`` finalizer has its reference removed
  from every dependent, then the finalizer.
- A dependent that still has a live owner only loses its references to the owners that are
  gone or being deleted in the foreground.

The graph is kept in memory from one informer per kind (a monitor): every kind that can be
listed, watched and deleted, except Events (numerous and never owned). The built-in kinds are
watched through the shared informers from the start; the rest (custom resources) are found
through the API's discovery, as Kubernetes' collector resyncs its monitors: when it starts,
every ``resync_period`` seconds, and soon after an owner reference names a kind it does not
know. A kind no longer served (its CRD deleted) loses its monitor, and its objects count as
gone. Two indexes,
uid -> object and owner uid -> dependent uids, make each decision a lookup. An owner not in
the caches may simply not have been seen yet, so before treating it as gone the collector
reads it from the API (and remembers owners confirmed absent).

Each look at an object is a pure decision (``decide_owner`` for an owner being deleted with
the orphan or foreground finalizer, ``decide_dependent`` over the states of its owners) that
the collector then carries out.

Not done: cycle detection between foreground deletions. An owner reference to a kind the
server does not serve is left alone (the owner counts as present).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gpufleet.api.registry import ResourceType
from gpufleet.client import discovery, objects
from gpufleet.client.api import Client, retry_on_conflict
from gpufleet.client.controller import Requeue
from gpufleet.client.errors import ApiError, NotFound
from gpufleet.client.informer import Informer, SharedInformerFactory
from gpufleet.controllers._common import edit_owner_references
from gpufleet.controllers.actions import Actions, Delete, apply
from gpufleet.controllers.base import QueueController

log = logging.getLogger(__name__)

FOREGROUND = "foregroundDeletion"
ORPHAN = "orphan"
IGNORED_KINDS = frozenset({"events", "events.events.k8s.io"})
ABSENT_CACHE_SIZE = 1024
# How often the monitored kinds are brought in line with discovery (Kubernetes: 30 s), and the
# least time between two rediscoveries an unknown owner kind asks for.
RESYNC_PERIOD = 10.0
RESYNC_MIN_INTERVAL = 1.0


def monitorable(rt: ResourceType, ignored: frozenset[str] = IGNORED_KINDS) -> bool:
    """Whether the collector watches ``rt``: listable, watchable and deletable, not ignored."""
    return rt.key not in ignored and {"list", "watch", "delete"} <= set(rt.verbs)


def _refs(obj: Any) -> list[Any]:
    return list(objects.meta(obj, "ownerReferences") or [])


def _ref_uids(obj: Any) -> set[str]:
    return {objects.field(r, "uid") for r in _refs(obj) if objects.field(r, "uid")}


def _finalizers(obj: Any) -> list[str]:
    return list(objects.meta(obj, "finalizers") or [])


def _deleting(obj: Any) -> bool:
    return objects.meta(obj, "deletionTimestamp") is not None


# What an owner reference leads to.
SOLID = "solid"  # an owner that stays
DANGLING = "dangling"  # gone
WAITING = "waiting"  # being deleted in the foreground, waiting for its dependents


@dataclass
class Collection:
    """What one look at an object decided: delete it with ``delete`` as propagation policy,
    drop its references to the owners ``drop_refs``, drop the references of ``orphan`` (its
    dependents) to it, look again at the dependents ``enqueue``, and remove ``finalizer``
    from it once that is done."""

    reason: str
    delete: str | None = None
    drop_refs: frozenset[str] = frozenset()
    orphan: list[tuple[ResourceType, Any]] = field(default_factory=list)
    enqueue: list[str] = field(default_factory=list)
    finalizer: str | None = None


def decide_owner(owner: Any, dependents: Sequence[tuple[ResourceType, Any]]) -> Collection:
    """An owner being deleted: with ``orphan``, its dependents lose their references to it,
    then the finalizer goes; with ``foregroundDeletion``, its dependents are deleted first and
    the finalizer goes once none left blocks it."""
    uid = objects.uid_of(owner)
    finalizers = _finalizers(owner)
    if ORPHAN in finalizers:
        return Collection("Orphan", orphan=list(dependents), finalizer=ORPHAN)
    if FOREGROUND not in finalizers:
        return Collection("Deleting")
    blocking = 0
    enqueue = []
    for _, dep in dependents:
        ref = next((r for r in _refs(dep) if objects.field(r, "uid") == uid), None)
        if ref is not None and objects.field(ref, "blockOwnerDeletion", False):
            blocking += 1
        if not _deleting(dep):
            enqueue.append(objects.uid_of(dep))
    return Collection("Foreground" if blocking else "ForegroundDone", enqueue=enqueue,
                      finalizer=None if blocking else FOREGROUND)


def decide_dependent(obj: Any, owners: Sequence[tuple[str, str | None]], has_dependents: bool) -> Collection:
    """An object with owner references, given the state of each owner (uid, SOLID, DANGLING,
    WAITING, or None for an owner of a kind unknown here, which counts as solid)."""
    solid = [uid for uid, state in owners if state not in (DANGLING, WAITING)]
    if solid:
        gone = frozenset(uid for uid, state in owners if state in (DANGLING, WAITING))
        return Collection("OwnersLeft", drop_refs=gone) if gone else Collection("Owned")
    if any(state == WAITING for _, state in owners) and has_dependents:
        # Its own dependents must go before it does, since its owner waits for all of them.
        return Collection("OwnerWaiting", delete="Foreground")
    finalizers = _finalizers(obj)
    policy = "Orphan" if ORPHAN in finalizers else "Foreground" if FOREGROUND in finalizers else "Background"
    return Collection("OwnersGone", delete=policy)


class GarbageCollector(QueueController):
    name = "garbagecollector"

    def __init__(self, client: Client, informers: SharedInformerFactory, *,
                 ignored: frozenset[str] = IGNORED_KINDS, resync_period: float = RESYNC_PERIOD,
                 **kwargs: Any) -> None:
        super().__init__(client, informers, **kwargs)
        self.monitors: dict[str, Informer] = {}
        self._types: dict[str, ResourceType] = {}
        # uid -> (resource key, object key)
        self._uids: dict[str, tuple[str, str]] = {}
        # owner uid -> dependent uids (owners may not exist, or not be cached yet)
        self._dependents: dict[str, set[str]] = {}
        self._absent: OrderedDict[str, None] = OrderedDict()
        self.ignored = ignored
        self.resync_period = resync_period
        # The monitors found through discovery (this collector's own informers).
        self._dynamic: dict[str, Informer] = {}
        self._wake = asyncio.Event()
        self._resync_task: asyncio.Task[None] | None = None
        for rt in client.registry.all():
            if monitorable(rt, ignored):
                self._monitor(rt, informers.informer(rt))

    def _monitor(self, rt: ResourceType, informer: Informer) -> None:
        self.monitors[rt.key] = informer
        self._types[rt.key] = rt
        informer.add_event_handler(
            functools.partial(self._added, rt.key),
            functools.partial(self._updated, rt.key),
            functools.partial(self._deleted, rt.key),
        )

    # -- the monitored kinds ------------------------------------------------------------------

    async def start(self) -> None:
        await self.resync_monitors()
        await super().start()
        self._resync_task = asyncio.create_task(self._resync_loop(), name="garbagecollector:resync")

    async def stop(self) -> None:
        if self._resync_task is not None:
            self._resync_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._resync_task
            self._resync_task = None
        await super().stop()
        for informer in self._dynamic.values():
            await informer.stop()

    async def _resync_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.resync_period)
            self._wake.clear()
            started = time.monotonic()
            try:
                await self.resync_monitors()
            except Exception:
                log.exception("garbage collector: resyncing the monitors")
            await asyncio.sleep(max(0.0, RESYNC_MIN_INTERVAL - (time.monotonic() - started)))

    async def resync_monitors(self) -> None:
        """Monitors for the kinds discovery lists that have none; those of kinds no longer
        served stopped, their objects counted as gone."""
        try:
            types = await discovery.preferred_resources(self.client)
        except discovery.DiscoveryError as e:
            log.info("garbage collector: discovery failed, monitors kept: %s", e)
            return
        discovery.learn(self.client, types)
        wanted = {rt.key: rt for rt in types if monitorable(rt, self.ignored)}
        for key in [k for k, informer in self._dynamic.items() if k not in wanted or wanted[k] != informer.rt]:
            await self._forget_kind(key)
        added = []
        for key, rt in wanted.items():
            if key in self.monitors:
                continue
            informer = Informer(self.client, rt, raw=True, strip_managed_fields=True)
            self._dynamic[key] = informer
            self._monitor(rt, informer)
            await informer.start()
            added.append(informer)
        if added:
            log.info("garbage collector: watching %s", ", ".join(i.rt.key for i in added))
            for informer in added:
                await informer.wait_for_sync(10.0)
            # Owners of these kinds were unknown until now: their dependents are looked at again.
            for deps in list(self._dependents.values()):
                for dep in deps:
                    self.queue.add(dep)

    async def _forget_kind(self, key: str) -> None:
        informer = self._dynamic.pop(key)
        self.monitors.pop(key, None)
        self._types.pop(key, None)
        await informer.stop()
        log.info("garbage collector: %s is no longer served", key)
        for obj in informer.list():
            uid = objects.uid_of(obj)
            self._deleted(key, obj)
            if uid:
                self._remember_absent(uid)

    def _remember_absent(self, uid: str) -> None:
        self._absent[uid] = None
        while len(self._absent) > ABSENT_CACHE_SIZE:
            self._absent.popitem(last=False)

    def _owner_type(self, api_version: str, kind: str) -> ResourceType | None:
        rt = self.client.registry.by_api_version_kind(api_version, kind)
        if rt is not None:
            return rt
        group = api_version.rpartition("/")[0]
        # Another version of a monitored kind (the monitor watches its preferred version).
        return next((t for t in self._types.values() if t.group == group and t.kind == kind), None)

    # -- the graph ----------------------------------------------------------------------------

    def _link(self, obj: Any) -> None:
        uid = objects.uid_of(obj)
        for owner in _ref_uids(obj):
            self._dependents.setdefault(owner, set()).add(uid)

    def _unlink(self, obj: Any) -> None:
        uid = objects.uid_of(obj)
        for owner in _ref_uids(obj):
            deps = self._dependents.get(owner)
            if deps is not None:
                deps.discard(uid)
                if not deps:
                    del self._dependents[owner]

    def _interesting(self, obj: Any) -> bool:
        finalizers = _finalizers(obj)
        return bool(_refs(obj)) or (_deleting(obj) and (FOREGROUND in finalizers or ORPHAN in finalizers))

    def _added(self, rt_key: str, obj: Any) -> None:
        uid = objects.uid_of(obj)
        if not uid:
            return
        self._uids[uid] = (rt_key, objects.object_key(obj))
        self._absent.pop(uid, None)
        self._link(obj)
        if self._interesting(obj):
            self.queue.add(uid)

    def _updated(self, rt_key: str, old: Any, new: Any) -> None:
        uid = objects.uid_of(new)
        if not uid:
            return
        self._uids[uid] = (rt_key, objects.object_key(new))
        refs_changed = _refs(old) != _refs(new)
        if refs_changed:
            self._unlink(old)
            self._link(new)
        deletion_changed = _deleting(old) != _deleting(new) or _finalizers(old) != _finalizers(new)
        if (refs_changed or deletion_changed) and self._interesting(new):
            self.queue.add(uid)
        if refs_changed:
            # An owner waiting for its dependents may have just lost one.
            for owner in _ref_uids(old) - _ref_uids(new):
                self.queue.add(owner)

    def _deleted(self, rt_key: str, obj: Any) -> None:
        uid = objects.uid_of(obj)
        if not uid:
            return
        if self._uids.get(uid, (None, None))[0] == rt_key:
            del self._uids[uid]
        self._unlink(obj)
        # Its dependents may be orphans now; its owners may be waiting for it.
        for dep in self._dependents.get(uid, ()):
            self.queue.add(dep)
        for owner in _ref_uids(obj):
            self.queue.add(owner)

    def _lookup(self, uid: str) -> tuple[ResourceType, Any] | None:
        entry = self._uids.get(uid)
        if entry is None:
            return None
        rt_key, key = entry
        monitor = self.monitors.get(rt_key)
        obj = monitor.get(key) if monitor is not None else None
        if obj is None or objects.uid_of(obj) != uid:
            return None
        return self._types[rt_key], obj

    def dependents_of(self, uid: str) -> list[tuple[ResourceType, Any]]:
        out = []
        for dep in sorted(self._dependents.get(uid, ())):
            found = self._lookup(dep)
            if found is not None:
                out.append(found)
        return out

    # -- decisions ----------------------------------------------------------------------------

    def _synced(self) -> bool:
        return all(m.has_synced for m in self.monitors.values())

    async def reconcile(self, uid: str) -> Requeue | None:
        if not self._synced():
            return Requeue(after=0.2)
        found = self._lookup(uid)
        if found is None:
            return None
        rt, obj = found
        try:
            if _deleting(obj):
                await self._carry_out(rt, obj, decide_owner(obj, self.dependents_of(uid)))
            elif _refs(obj):
                owners = [(objects.field(ref, "uid"), await self._owner_state(obj, ref)) for ref in _refs(obj)]
                await self._carry_out(rt, obj, decide_dependent(obj, owners, bool(self._dependents.get(uid))))
        except NotFound:
            return None
        except ApiError as e:
            log.info("garbage collector: %s %s: %s", rt.kind, objects.object_key(obj), e)
            return Requeue()
        return None

    async def _owner_state(self, obj: Any, ref: Any) -> str | None:
        """SOLID, DANGLING (gone), WAITING (being deleted in the foreground), or None when the
        owner's kind is unknown here."""
        owner_uid = objects.field(ref, "uid")
        found = self._lookup(owner_uid)
        if found is not None:
            owner = found[1]
            return WAITING if _deleting(owner) and FOREGROUND in _finalizers(owner) else SOLID
        if owner_uid in self._absent:
            return DANGLING
        rt = self._owner_type(objects.field(ref, "apiVersion") or "", objects.field(ref, "kind") or "")
        if rt is None or (rt.key not in self.monitors and monitorable(rt, self.ignored)):
            self._wake.set()  # a kind made since the last discovery: watch it soon
        if rt is None:
            return None
        ns = (objects.namespace_of(obj) or None) if rt.namespaced else None
        try:
            live = await self.client.get(rt, objects.field(ref, "name"), ns, raw=True)
        except NotFound:
            live = None
        meta = (live or {}).get("metadata") or {}
        if live is None or meta.get("uid") != owner_uid:
            self._remember_absent(owner_uid)
            return DANGLING
        deleting = meta.get("deletionTimestamp") and FOREGROUND in (meta.get("finalizers") or [])
        return WAITING if deleting else SOLID

    async def _carry_out(self, rt: ResourceType, obj: Any, decision: Collection) -> None:
        if decision.drop_refs:
            await _drop_owner_refs(self.client, rt, obj, decision.drop_refs)
        for uid in decision.enqueue:
            self.queue.add(uid)
        for dep_rt, dep in decision.orphan:
            await _drop_owner_refs(self.client, dep_rt, dep, frozenset({objects.uid_of(obj)}))
        if decision.delete is not None:
            if decision.reason == "OwnersGone":
                log.info("garbage collector: deleting %s %s (owners gone)", rt.kind, objects.object_key(obj))
            delete = Delete(rt, objects.name_of(obj), objects.namespace_of(obj) or None, uid=objects.uid_of(obj),
                            propagation_policy=decision.delete, ignore_conflict=True)
            # Gone already, or replaced by a new object of the same name: not ours to delete.
            await apply(self.client, Actions(deletes=[delete], reason=decision.reason))
        if decision.finalizer is not None:
            await self._remove_finalizer(rt, obj, decision.finalizer)

    async def _remove_finalizer(self, rt: ResourceType, obj: Any, finalizer: str) -> None:
        uid = objects.uid_of(obj)
        ns = objects.namespace_of(obj) or None

        async def attempt() -> None:
            try:
                fresh = await self.client.get(rt, objects.name_of(obj), ns, raw=True)
            except NotFound:
                return
            meta = fresh["metadata"]
            if meta.get("uid") != uid or finalizer not in (meta.get("finalizers") or []):
                return
            meta["finalizers"] = [f for f in meta["finalizers"] if f != finalizer]
            try:
                await self.client.update(fresh, raw=True)
            except NotFound:
                return

        await retry_on_conflict(attempt)


async def _drop_owner_refs(client: Client, rt: ResourceType, obj: Any, uids: frozenset[str]) -> None:
    def edit(refs: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
        kept = [r for r in refs if r.get("uid") not in uids]
        return kept if len(kept) != len(refs) else None

    await edit_owner_references(client, rt, obj, edit)
