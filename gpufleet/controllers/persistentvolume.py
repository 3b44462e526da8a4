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
from gpufleet.client.events import NORMAL, WARNING
from gpufleet.client.informer import SharedInformerFactory
from gpufleet.controllers._common import annotations_of, volume_claim_key
from gpufleet.controllers.base import QueueController
from gpufleet.utils.clock import rfc3339

log = logging.getLogger(__name__)

COMPONENT = "persistentvolume-controller"
CLAIM, VOLUME = "claim", "volume"
# Pods by the claims they use ("namespace/claim"), volumes by the claim they name.
POD_CLAIMS_INDEX = "podClaims"
VOLUME_CLAIM_INDEX = "volumeClaim"
# How often a claim that is still Pending is looked at again (Kubernetes resyncs every 15 s):
# a volume or class may have appeared without an event this controller watches for.
PENDING_RESYNC = 15.0

YES = "yes"


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

    # -- claims -----------------------------------------------------------------------------------

    async def sync_claim(self, key: str) -> Requeue | None:
        pvc = self._claim(key)
        if pvc is None:
            return None
        if storage.being_deleted(pvc):
            await self._release_claim_protection(pvc)
            return None
        if storage.ANN_BIND_COMPLETED in annotations_of(pvc):
            await self._sync_bound_claim(pvc)
            return None
        await self._sync_unbound_claim(pvc)
        claim = self._claim(key)
        if claim is not None and (claim.get("status") or {}).get("phase") != storage.CLAIM_BOUND:
            return Requeue(after=self.pending_resync)
        return None

    async def _sync_unbound_claim(self, pvc: dict[str, Any]) -> None:
        spec = pvc.get("spec") or {}
        volume_name = spec.get("volumeName") or ""
        if volume_name:
            await self._sync_requested_volume(pvc, volume_name)
            return
        sc = self._class(storage.claim_class(pvc))
        delayed = storage.waits_for_first_consumer(sc)
        selected = annotations_of(pvc).get(storage.ANN_SELECTED_NODE)
        node = (selected, self._node_labels(selected)) if delayed and selected else None
        volume = storage.find_matching_volume(pvc, self._all_volumes(), delay_binding=delayed and not selected,
                                              node=node, prebound_anywhere=True)
        if volume is not None:
            await self._bind(dict(volume), pvc)
            return
        if storage.claim_class_unset(pvc) and await self._assign_default_class(pvc):
            return
        if delayed and not selected:
            await self._record_waiting_for_consumer(pvc)
        elif storage.claim_class(pvc):
            await self._hand_to_provisioner(pvc, sc)
            return
        else:
            await self.recorder.record(pvc, NORMAL, "FailedBinding",
                                       "no persistent volumes available for this claim and no storage class is set")
        await self._set_claim_phase(pvc, storage.CLAIM_PENDING)

    async def _sync_requested_volume(self, pvc: dict[str, Any], volume_name: str) -> None:
        """The claim names its volume (a user's pre-binding, or a binding this controller
        started and must finish)."""
        pv = self._volume(volume_name)
        if pv is None:
            await self._set_claim_phase(pvc, storage.CLAIM_PENDING)
            return
        ref = (pv.get("spec") or {}).get("claimRef")
        if not ref:
            why = storage.mismatch(pv, pvc)
            if why is not None:
                await self.recorder.record(pvc, WARNING, "VolumeMismatch",
                                           f'Cannot bind to requested volume "{volume_name}": {why}')
                await self._set_claim_phase(pvc, storage.CLAIM_PENDING)
                return
            await self._bind(dict(pv), pvc)
        elif storage.is_volume_bound_to_claim(pv, pvc):
            await self._bind(dict(pv), pvc)
        else:
            await self.recorder.record(pvc, WARNING, "FailedBinding",
                                       f'volume "{volume_name}" already bound to a different claim.')
            await self._set_claim_phase(pvc, storage.CLAIM_PENDING)

    async def _sync_bound_claim(self, pvc: dict[str, Any]) -> None:
        volume_name = (pvc.get("spec") or {}).get("volumeName") or ""
        if not volume_name:
            await self._lose_claim(pvc, "ClaimLost",
                                   "Bound claim has lost reference to PersistentVolume. Data on the volume is lost!")
            return
        pv = self._volume(volume_name)
        if pv is None:
            await self._lose_claim(pvc, "ClaimLost",
                                   "Bound claim has lost its PersistentVolume. Data on the volume is lost!")
            return
        ref = (pv.get("spec") or {}).get("claimRef")
        if not ref or ref.get("uid") == (pvc.get("metadata") or {}).get("uid"):
            await self._bind(dict(pv), pvc)
            return
        await self._lose_claim(pvc, "ClaimMisbound", "Two claims are bound to the same volume, this one is bound "
                                                     "incorrectly")

    async def _lose_claim(self, pvc: dict[str, Any], reason: str, message: str) -> None:
        if (pvc.get("status") or {}).get("phase") == storage.CLAIM_LOST:
            return
        await self._set_claim_phase(pvc, storage.CLAIM_LOST)
        await self.recorder.record(pvc, WARNING, reason, message)

    async def _assign_default_class(self, pvc: dict[str, Any]) -> bool:
        default = storage.default_class(sc.to_dict() for sc in self.classes.list())
        if default is None:
            return False
        body = _copy(pvc)
        body["spec"]["storageClassName"] = default["metadata"]["name"]
        try:
            await self.client.update(body, raw=True)
        except NotFound:
            return True
        return True

    async def _record_waiting_for_consumer(self, pvc: dict[str, Any]) -> None:
        key = storage.claim_key(pvc)
        waiting = sorted(objects.name_of(p) for p in self.pods.by_index(POD_CLAIMS_INDEX, key)
                         if not (p.spec and p.spec.node_name) and not (p.metadata and p.metadata.deletion_timestamp))
        if not waiting:
            await self.recorder.record(pvc, NORMAL, "WaitForFirstConsumer",
                                       "waiting for first consumer to be created before binding")
        elif len(waiting) == 1:
            await self.recorder.record(pvc, NORMAL, "WaitForPodScheduled", f"waiting for pod {waiting[0]} to be scheduled")
        else:
            await self.recorder.record(pvc, NORMAL, "WaitForPodScheduled",
                                       f"waiting for pods {','.join(waiting)} to be scheduled")

    async def _hand_to_provisioner(self, pvc: dict[str, Any], sc: dict[str, Any] | None) -> None:
        class_name = storage.claim_class(pvc)
        if sc is None:
            await self.recorder.record(pvc, WARNING, "ProvisioningFailed",
                                       f'storageclass.storage.k8s.io "{class_name}" not found')
            await self._set_claim_phase(pvc, storage.CLAIM_PENDING)
            return
        if not storage.can_provision(sc):
            await self.recorder.record(
                pvc, NORMAL, "FailedBinding",
                f'no persistent volumes available for this claim and storage class "{class_name}" does not provision '
                "volumes (provisioner kubernetes.io/no-provisioner): create a matching PersistentVolume")
            await self._set_claim_phase(pvc, storage.CLAIM_PENDING)
            return
        provisioner = sc["provisioner"]
        annotations = annotations_of(pvc)
        if (annotations.get(storage.ANN_STORAGE_PROVISIONER), annotations.get(storage.ANN_BETA_STORAGE_PROVISIONER)) \
                != (provisioner, provisioner):
            body = _copy(pvc)
            body["metadata"]["annotations"] = {**annotations, storage.ANN_STORAGE_PROVISIONER: provisioner,
                                               storage.ANN_BETA_STORAGE_PROVISIONER: provisioner}
            try:
                pvc = await self.client.update(body, raw=True)
            except NotFound:
                return
        await self.recorder.record(
            pvc, NORMAL, "ExternalProvisioning",
            f"Waiting for a volume to be created either by the external provisioner '{provisioner}' or manually by "
            "the system administrator. If volume creation is delayed, please verify that the provisioner is running "
            "and correctly registered.")

    async def _release_claim_protection(self, pvc: dict[str, Any]) -> None:
        finalizers = list((pvc.get("metadata") or {}).get("finalizers") or [])
        if storage.PVC_PROTECTION_FINALIZER not in finalizers:
            return
        name = (pvc.get("metadata") or {}).get("name") or ""
        key = storage.claim_key(pvc)
        if any(storage.pod_uses_claim(p.to_dict(), name) for p in self.pods.by_index(POD_CLAIMS_INDEX, key)):
            return
        # The cache may not have seen a pod bound a moment ago: ask the API before letting go.
        live = await self.client.list("pods", objects.namespace_of(pvc) or None, raw=True)
        if any(storage.pod_uses_claim(p, name) for p in live.items):
            return
        body = _copy(pvc)
        body["metadata"]["finalizers"] = [f for f in finalizers if f != storage.PVC_PROTECTION_FINALIZER]
        try:
            await self.client.update(body, raw=True)
        except NotFound:
            return
        log.info("claim %s is no longer used; removed %s", key, storage.PVC_PROTECTION_FINALIZER)

    # -- binding ----------------------------------------------------------------------------------

    async def _bind(self, pv: dict[str, Any], pvc: dict[str, Any]) -> None:
        """Bind both sides, each write only if something is missing; a Conflict (raised)
        sends the key back to be synced afresh."""
        pv = await self._bind_volume_to_claim(pv, pvc)
        if pv is None:
            return
        pv = await self._set_volume_phase(pv, storage.VOLUME_BOUND)
        if pv is None:
            return
        pvc_after = await self._bind_claim_to_volume(pvc, pv)
        if pvc_after is None:
            return
        await self._set_claim_phase(pvc_after, storage.CLAIM_BOUND, pv)

    async def _bind_volume_to_claim(self, pv: dict[str, Any], pvc: dict[str, Any]) -> dict[str, Any] | None:
        meta = pvc.get("metadata") or {}
        ref = (pv.get("spec") or {}).get("claimRef")
        wanted = {"kind": "PersistentVolumeClaim", "namespace": meta.get("namespace"), "name": meta.get("name"),
                  "uid": meta.get("uid"), "apiVersion": "v1", "resourceVersion": meta.get("resourceVersion")}
        if ref and all(ref.get(k) == wanted[k] for k in ("kind", "namespace", "name", "uid", "apiVersion")):
            return pv
        body = _copy(pv)
        body["spec"]["claimRef"] = {k: v for k, v in wanted.items() if v}
        if not ref:
            body["metadata"]["annotations"] = {**annotations_of(pv), storage.ANN_BOUND_BY_CONTROLLER: YES}
        try:
            return await self.client.update(body, raw=True)
        except NotFound:
            return None

    async def _bind_claim_to_volume(self, pvc: dict[str, Any], pv: dict[str, Any]) -> dict[str, Any] | None:
        name = pv["metadata"]["name"]
        annotations = annotations_of(pvc)
        spec = pvc.get("spec") or {}
        if spec.get("volumeName") == name and annotations.get(storage.ANN_BIND_COMPLETED) == YES:
            return pvc
        body = _copy(pvc)
        if not spec.get("volumeName"):
            annotations[storage.ANN_BOUND_BY_CONTROLLER] = YES
        body["spec"]["volumeName"] = name
        annotations[storage.ANN_BIND_COMPLETED] = YES
        body["metadata"]["annotations"] = annotations
        try:
            bound = await self.client.update(body, raw=True)
        except NotFound:
            return None
        log.info("bound claim %s to volume %s", storage.claim_key(pvc), name)
        return bound

    async def _set_claim_phase(self, pvc: dict[str, Any], phase: str, pv: dict[str, Any] | None = None) -> None:
        status = dict(pvc.get("status") or {})
        wanted = dict(status, phase=phase)
        if pv is None:
            wanted.pop("accessModes", None)
            wanted.pop("capacity", None)
        else:
            pv_spec = pv.get("spec") or {}
            wanted["accessModes"] = list(pv_spec.get("accessModes") or [])
            wanted["capacity"] = dict(pv_spec.get("capacity") or {})
        if wanted == status:
            return
        body = _copy(pvc)
        body["status"] = wanted
        try:
            await self.client.update_status(body, raw=True)
        except NotFound:
            return

    async def _set_volume_phase(self, pv: dict[str, Any], phase: str, message: str = "") -> dict[str, Any] | None:
        status = dict(pv.get("status") or {})
        if status.get("phase") == phase and (status.get("message") or "") == message:
            return pv
        wanted = dict(status, phase=phase)
        if message:
            wanted["message"] = message
        else:
            wanted.pop("message", None)
        if status.get("phase") != phase:
            wanted["lastPhaseTransitionTime"] = rfc3339(self.clock.now())
        body = _copy(pv)
        body["status"] = wanted
        try:
            return await self.client.update_status(body, raw=True)
        except NotFound:
            return None

    # -- volumes ----------------------------------------------------------------------------------

    async def sync_volume(self, name: str) -> Requeue | None:
        pv = self._volume(name)
        if pv is None:
            return None
        if storage.being_deleted(pv):
            pv = await self._release_volume_protection(pv)
            if pv is None:
                return None
        ref = (pv.get("spec") or {}).get("claimRef")
        if not ref or not ref.get("uid"):
            # Free, or pre-bound to a claim that has not been bound to it yet.
            await self._set_volume_phase(pv, storage.VOLUME_AVAILABLE)
            return None
        claim = await self._claim_of(pv, ref)
        phase = (pv.get("status") or {}).get("phase")
        if claim is None:
            if phase not in (storage.VOLUME_RELEASED, storage.VOLUME_FAILED):
                pv = await self._set_volume_phase(pv, storage.VOLUME_RELEASED)
                if pv is None:
                    return None
                log.info("volume %s is released; reclaim policy %s", name,
                         (pv.get("spec") or {}).get("persistentVolumeReclaimPolicy"))
            await self._reclaim(pv)
            return None
        volume_name = (claim.get("spec") or {}).get("volumeName") or ""
        if not volume_name:
            # Pre-bound or provisioned for the claim: the claim's sync finishes the binding.
            self._enqueue_claim(storage.claim_key(claim))
            return None
        if volume_name == name:
            await self._set_volume_phase(pv, storage.VOLUME_BOUND)
            return None
        # The claim went to another volume.
        if storage.provisioned_by(pv) and (pv.get("spec") or {}).get("persistentVolumeReclaimPolicy") == storage.DELETE:
            if phase not in (storage.VOLUME_RELEASED, storage.VOLUME_FAILED):
                pv = await self._set_volume_phase(pv, storage.VOLUME_RELEASED)
                if pv is None:
                    return None
            await self._reclaim(pv)
        elif annotations_of(pv).get(storage.ANN_BOUND_BY_CONTROLLER):
            await self._unbind_volume(pv)
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

    async def _unbind_volume(self, pv: dict[str, Any]) -> None:
        body = _copy(pv)
        body["spec"].pop("claimRef", None)
        annotations = annotations_of(pv)
        annotations.pop(storage.ANN_BOUND_BY_CONTROLLER, None)
        body["metadata"]["annotations"] = annotations
        try:
            pv = await self.client.update(body, raw=True)
        except NotFound:
            return
        await self._set_volume_phase(pv, storage.VOLUME_AVAILABLE)

    async def _reclaim(self, pv: dict[str, Any]) -> None:
        policy = (pv.get("spec") or {}).get("persistentVolumeReclaimPolicy") or storage.RETAIN
        name = pv["metadata"]["name"]
        if policy == storage.RETAIN:
            return
        if policy == storage.DELETE and storage.provisioned_by(pv):
            return  # the provisioner that made it deletes it, with its data
        if (pv.get("status") or {}).get("phase") == storage.VOLUME_FAILED:
            return
        if policy == storage.DELETE:
            reason = "VolumeFailedDelete"
            message = f'error getting deleter volume plugin for volume "{name}": no deletable volume plugin matched'
        else:
            reason, message = "VolumeFailedRecycle", "No recycler plugin found for the volume!"
        updated = await self._set_volume_phase(pv, storage.VOLUME_FAILED, message)
        if updated is not None:
            await self.recorder.record(updated, WARNING, reason, message)

    async def _release_volume_protection(self, pv: dict[str, Any]) -> dict[str, Any] | None:
        finalizers = list((pv.get("metadata") or {}).get("finalizers") or [])
        if storage.PV_PROTECTION_FINALIZER not in finalizers:
            return pv
        if (pv.get("status") or {}).get("phase") == storage.VOLUME_BOUND:
            return pv
        body = _copy(pv)
        body["metadata"]["finalizers"] = [f for f in finalizers if f != storage.PV_PROTECTION_FINALIZER]
        try:
            return await self.client.update(body, raw=True)
        except NotFound:
            return None


def _copy(obj: dict[str, Any]) -> dict[str, Any]:
    body = objects.to_dict(obj)
    body.setdefault("metadata", {})
    body.setdefault("spec", {})
    return body
