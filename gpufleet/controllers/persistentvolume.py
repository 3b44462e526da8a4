"""The PV controller: binds PersistentVolumeClaims to PersistentVolumes, keeps both phases,
reclaims released volumes, and guards claims and volumes in use against deletion.

As Kubernetes' persistent-volume-binder (pkg/controller/volume/persistentvolume) and its
pvc-protection and pv-protection controllers:

- A claim without a volume gets the best match (``storage.find_matching_volume``: a volume
  pre-bound to it, else the smallest Available one of its class, access modes, volume mode,
  size and selector). Binding writes the volume's ``claimRef`` (``pv.kubernetes.io/bound-by-
  controller: "yes"`` when this controller chose it), then the claim's ``spec.volumeName`` with
  ``pv.kubernetes.io/bind-completed: "yes"``, and both statuses Bound; the claim's status
  carries the volume's access modes and capacity. Every write is a compare-and-swap, and a
  half-done binding is finished by the next sync of either side.
- No match: a WaitForFirstConsumer claim waits for the scheduler to pick a node for its
  first pod (events WaitForFirstConsumer / WaitForPodScheduled); once the claim names the
  node (``volume.kubernetes.io/selected-node``) volumes reachable from it are tried. A claim
  of a class with a provisioner is annotated ``volume.kubernetes.io/storage-provisioner``
  (event ExternalProvisioning), which hands it to that provisioner; a claim of no class, or
  of a missing class, says so (FailedBinding, ProvisioningFailed). A claim created before
  any default class existed is given the default class once there is one.
- Claim phases: Pending, Bound, and Lost when its volume is gone or bound elsewhere.
  Volume phases: Pending (new), Available (free or pre-bound), Bound, Released (its claim
  was deleted), Failed (reclaiming failed).
- Reclaim of a Released volume: Retain keeps it Released with its data; Delete of a volume
  a provisioner made (``pv.kubernetes.io/provisioned-by``) is that provisioner's; any other
  volume has no deleter here and fails (VolumeFailedDelete), as does Recycle.
- Protection: a claim being deleted keeps ``kubernetes.io/pvc-protection`` while a pod that
  is scheduled and not finished uses it (checked against a live list before letting go); a
  volume being deleted keeps ``kubernetes.io/pv-protection`` while it is Bound.

The decisions are in persistentvolume_decide.py (a step at a time: each write is made on the
answer of the one before); this module holds the wiring, what a sync reads from the caches
and the API, and the apply of each step.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable
from typing import Any

from gpufleet.api import storage
from gpufleet.api.k8s import Node, PersistentVolume, PersistentVolumeClaim, Pod, StorageClass
from gpufleet.client import objects
from gpufleet.client.api import Client
from gpufleet.client.controller import Requeue
from gpufleet.client.errors import Conflict, NotFound
from gpufleet.client.informer import SharedInformerFactory
from gpufleet.controllers._common import annotations_of, volume_claim_key
from gpufleet.controllers.actions import Actions, apply
from gpufleet.controllers.base import QueueController
from gpufleet.controllers.persistentvolume_decide import (
    BIND,
    CHECK_LIVE_PODS,
    ENQUEUE_CLAIM,
    NEXT,
    RECLAIM,
    RELEASE,
    RELEASE_PROTECTION,
    THEN,
    UNBOUND,
    ClaimObserved,
    decide_claim,
    decide_claim_phase,
    decide_claim_protection,
    decide_claim_volume_name,
    decide_reclaim,
    decide_volume,
    decide_volume_claim_ref,
    decide_volume_phase,
    decide_volume_protection,
)

log = logging.getLogger(__name__)

COMPONENT = "persistentvolume-controller"
CLAIM, VOLUME = "claim", "volume"
# Pods by the claims they use ("namespace/claim"), volumes by the claim they name.
POD_CLAIMS_INDEX = "podClaims"
VOLUME_CLAIM_INDEX = "volumeClaim"
# How often a claim that is still Pending is looked at again (Kubernetes resyncs every 15 s):
# a volume or class may have appeared without an event this controller watches for.
PENDING_RESYNC = 15.0


def pod_claim_keys(pod: Any) -> list[str]:
    """'namespace/claim' of every claim a pod model uses."""
    spec = getattr(pod, "spec", None)
    meta = getattr(pod, "metadata", None)
    if spec is None or meta is None:
        return []
    out = []
    for vol in spec.volumes or ():
        if vol.persistent_volume_claim is not None and vol.persistent_volume_claim.claim_name:
            out.append(f"{meta.namespace or ''}/{vol.persistent_volume_claim.claim_name}")
        elif vol.ephemeral is not None:
            out.append(f"{meta.namespace or ''}/{meta.name or ''}-{vol.name}")
    return out


class PersistentVolumeController(QueueController):
    name = "persistentvolume"
    component = COMPONENT

    def __init__(
        self, client: Client, informers: SharedInformerFactory, *,
        pending_resync: float = PENDING_RESYNC,
        **kwargs: Any,
    ) -> None:
        super().__init__(client, informers, **kwargs)
        self.pending_resync = pending_resync
        self.claims = informers.informer(PersistentVolumeClaim)
        self.volumes = informers.informer(PersistentVolume)
        self.classes = informers.informer(StorageClass)
        self.pods = informers.informer(Pod)
        self.nodes = informers.informer(Node)
        self.pods.add_indexer(POD_CLAIMS_INDEX, pod_claim_keys)
        self.volumes.add_indexer(VOLUME_CLAIM_INDEX, volume_claim_key)
        self.claims.add_event_handler(self._claim_changed, lambda old, new: self._claim_changed(new),
                                      self._claim_deleted)
        self.volumes.add_event_handler(self._volume_changed, lambda old, new: self._volume_changed(new),
                                       self._volume_deleted)
        self.classes.add_event_handler(self._class_changed, lambda old, new: self._class_changed(new))
        self.pods.add_event_handler(self._pod_changed, self._pod_updated, self._pod_changed)
        # Wire forms of the cached models, by key, while their resourceVersion holds.
        self._wire_cache: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {}

    # -- informer callbacks: keys only ----------------------------------------------------------

    def _enqueue_claim(self, key: str) -> None:
        self.queue.add((CLAIM, key))

    def _enqueue_volume(self, name: str) -> None:
        self.queue.add((VOLUME, name))

    def _enqueue_unbound_claims(self) -> None:
        for pvc in self.claims.list():
            if not (pvc.spec and pvc.spec.volume_name):
                self._enqueue_claim(objects.object_key(pvc))

    def _claim_changed(self, pvc: Any) -> None:
        key = objects.object_key(pvc)
        self._enqueue_claim(key)
        for pv in self.volumes.by_index(VOLUME_CLAIM_INDEX, key):
            self._enqueue_volume(objects.name_of(pv))

    def _claim_deleted(self, pvc: Any) -> None:
        key = objects.object_key(pvc)
        self._wire_cache.pop((CLAIM, key), None)
        if pvc.spec is not None and pvc.spec.volume_name:
            self._enqueue_volume(pvc.spec.volume_name)
        for pv in self.volumes.by_index(VOLUME_CLAIM_INDEX, key):
            self._enqueue_volume(objects.name_of(pv))

    def _volume_changed(self, pv: Any) -> None:
        self._enqueue_volume(objects.name_of(pv))
        claim = volume_claim_key(pv)
        if claim:
            self._enqueue_claim(claim)
        if pv.status is not None and pv.status.phase == storage.VOLUME_AVAILABLE:
            # A volume that became free may be what a pending claim waits for.
            self._enqueue_unbound_claims()

    def _volume_deleted(self, pv: Any) -> None:
        self._wire_cache.pop((VOLUME, objects.name_of(pv)), None)
        claim = volume_claim_key(pv)
        if claim:
            self._enqueue_claim(claim)

    def _class_changed(self, sc: Any) -> None:
        self._enqueue_unbound_claims()

    def _pod_changed(self, pod: Any) -> None:
        for key in pod_claim_keys(pod):
            self._enqueue_claim(key)

    def _pod_updated(self, old: Any, new: Any) -> None:
        # Only a change of node or phase matters to a claim: binding, protection, waiting.
        if old is not None:
            before = (old.spec.node_name if old.spec else None, old.status.phase if old.status else None)
            after = (new.spec.node_name if new.spec else None, new.status.phase if new.status else None)
            if before == after and old.metadata.deletion_timestamp == new.metadata.deletion_timestamp:
                return
        self._pod_changed(new)

    # -- reading the caches -----------------------------------------------------------------------

    def _wire(self, kind: str, obj: Any) -> dict[str, Any]:
        key = (kind, objects.object_key(obj))
        rv = objects.resource_version_of(obj)
        cached = self._wire_cache.get(key)
        if cached is not None and cached[0] == rv:
            return cached[1]
        data = obj.to_dict()
        self._wire_cache[key] = (rv, data)
        return data

    def _claim(self, key: str) -> dict[str, Any] | None:
        obj = self.claims.get(key)
        return self._wire(CLAIM, obj) if obj is not None else None

    def _volume(self, name: str) -> dict[str, Any] | None:
        obj = self.volumes.get(name)
        return self._wire(VOLUME, obj) if obj is not None else None

    def _all_volumes(self) -> list[dict[str, Any]]:
        return [self._wire(VOLUME, v) for v in self.volumes.list()]

    def _class(self, name: str) -> dict[str, Any] | None:
        if not name:
            return None
        obj = self.classes.get(name)
        return obj.to_dict() if obj is not None else None

    def _node_labels(self, name: str) -> dict[str, str]:
        node = self.nodes.get(name)
        return dict((node.metadata.labels if node is not None and node.metadata else None) or {})

    def _observe_claim(self, pvc: dict[str, Any]) -> ClaimObserved:
        spec = pvc.get("spec") or {}
        volume_name = spec.get("volumeName") or ""
        selected = annotations_of(pvc).get(storage.ANN_SELECTED_NODE) or ""
        unbound = not volume_name and storage.ANN_BIND_COMPLETED not in annotations_of(pvc)
        key = storage.claim_key(pvc)
        users = self.pods.by_index(POD_CLAIMS_INDEX, key)
        return ClaimObserved(
            pvc=pvc,
            volume=self._volume(volume_name) if volume_name else None,
            storage_class=self._class(storage.claim_class(pvc)),
            volumes=self._all_volumes() if unbound else [],
            default_class=storage.default_class(sc.to_dict() for sc in self.classes.list()) if unbound else None,
            node_labels=self._node_labels(selected) if selected else {},
            waiting_pods=sorted(objects.name_of(p) for p in users if not (p.spec and p.spec.node_name)
                                and not (p.metadata and p.metadata.deletion_timestamp)),
            used=storage.being_deleted(pvc)
            and any(storage.pod_uses_claim(p.to_dict(), objects.name_of(pvc)) for p in users),
        )

    # -- reconcile --------------------------------------------------------------------------------

    async def reconcile(self, key: Hashable) -> Requeue | None:
        kind, name = key  # type: ignore[misc]
        try:
            if kind == CLAIM:
                return await self.sync_claim(name)
            return await self.sync_volume(name)
        except Conflict:
            # Someone wrote in between (or the cache is behind our own last write): read
            # the new state and decide again, after the queue's short back-off.
            return Requeue()

    async def _step(self, obj: dict[str, Any], actions: Actions) -> dict[str, Any] | None:
        """Apply one step's ``actions`` about ``obj``: the object as its write answered (``obj``
        when nothing was written), None when it is gone. Events in ``memo[THEN]`` are
        recorded once the write succeeded."""
        try:
            outcome = await apply(self.client, actions, owner=obj, recorder=self.recorder)
        except NotFound:
            return None
        answer = outcome.updated[-1] if outcome.updated else outcome.owner or obj
        for ev in actions.memo.get(THEN, ()):
            await self.recorder.record(answer, ev.type, ev.reason, ev.message)
        return answer

    # -- claims -----------------------------------------------------------------------------------

    async def sync_claim(self, key: str) -> Requeue | None:
        pvc = self._claim(key)
        if pvc is None:
            return None
        actions = decide_claim(self._observe_claim(pvc), self.now())
        if actions.reason == CHECK_LIVE_PODS:
            # The cache may not have seen a pod bound a moment ago: ask the API before letting go.
            live = await self.client.list("pods", objects.namespace_of(pvc) or None, raw=True)
            actions = decide_claim_protection(pvc, cached_users=False, live_pods=live.items)
        if await self._step(pvc, actions) is not None and actions.reason == RELEASE_PROTECTION:
            log.info("claim %s is no longer used; removed %s", key, storage.PVC_PROTECTION_FINALIZER)
        bind = actions.memo.get(BIND)
        if bind is not None:
            await self._bind(bind, pvc)
        if not actions.memo.get(UNBOUND):
            return None
        claim = self._claim(key)
        if claim is not None and (claim.get("status") or {}).get("phase") != storage.CLAIM_BOUND:
            return Requeue(after=self.pending_resync)
        return None

    async def _bind(self, pv: dict[str, Any], pvc: dict[str, Any]) -> None:
        """Bind both sides, each write only if something is missing, each on the answer of the
        one before; a Conflict (raised) sends the key back to be synced afresh."""
        bound_pv = await self._step(pv, decide_volume_claim_ref(pv, pvc))
        if bound_pv is None:
            return
        bound_pv = await self._step(bound_pv, decide_volume_phase(bound_pv, storage.VOLUME_BOUND, self.now()))
        if bound_pv is None:
            return
        actions = decide_claim_volume_name(pvc, bound_pv)
        bound_pvc = await self._step(pvc, actions)
        if bound_pvc is None:
            return
        if actions.updates:
            log.info("bound claim %s to volume %s", storage.claim_key(pvc), bound_pv["metadata"]["name"])
        await self._step(bound_pvc, decide_claim_phase(bound_pvc, storage.CLAIM_BOUND, bound_pv))

    # -- volumes ----------------------------------------------------------------------------------

    async def sync_volume(self, name: str) -> Requeue | None:
        pv = self._volume(name)
        if pv is None:
            return None
        if storage.being_deleted(pv):
            pv = await self._step(pv, decide_volume_protection(pv))
            if pv is None:
                return None
        ref = (pv.get("spec") or {}).get("claimRef")
        claim = await self._claim_of(pv, ref) if ref and ref.get("uid") else None
        now = self.now()
        actions = decide_volume(pv, claim, now)
        enqueue = actions.memo.get(ENQUEUE_CLAIM)
        if enqueue:
            self._enqueue_claim(enqueue)
        after = await self._step(pv, actions)
        if after is None:
            return None
        if actions.reason == RELEASE:
            log.info("volume %s is released; reclaim policy %s", name,
                     (after.get("spec") or {}).get("persistentVolumeReclaimPolicy"))
        then = actions.memo.get(NEXT)
        if then == RECLAIM:
            await self._step(after, decide_reclaim(after, now))
        elif then == storage.VOLUME_AVAILABLE:
            await self._step(after, decide_volume_phase(after, storage.VOLUME_AVAILABLE, now))
        return None

    async def _claim_of(self, pv: dict[str, Any], ref: dict[str, Any]) -> dict[str, Any] | None:
        """The claim the volume is bound to, or None when that claim is gone. The cache may
        lag behind a claim just created (or re-created): the API has the last word before a
        volume is released."""
        key = f"{ref.get('namespace') or ''}/{ref.get('name') or ''}"
        claim = self._claim(key)
        if claim is not None and claim["metadata"].get("uid") == ref.get("uid"):
            return claim
        if claim is None and (pv.get("status") or {}).get("phase") in (storage.VOLUME_RELEASED, storage.VOLUME_FAILED):
            return None
        try:
            live = await self.client.get("persistentvolumeclaims", ref.get("name") or "", ref.get("namespace"), raw=True)
        except NotFound:
            return None
        return live if live["metadata"].get("uid") == ref.get("uid") else None
