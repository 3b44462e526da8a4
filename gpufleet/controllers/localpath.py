"""The local-path provisioner: a directory on the node as a claim's volume, the way Rancher's
local-path-provisioner (k3s's default storage) makes them, so its manifests carry over.

It answers to the provisioner names ``gpufleet.io/local-path`` and ``rancher.io/local-path``.
At start it creates the StorageClass ``local-path`` when there is none of that name
(WaitForFirstConsumer, reclaim policy Delete, parameter ``nodePath``; the default class
unless another class already is).

- A claim is provisioned once the PV controller handed it over (annotation
  ``volume.kubernetes.io/storage-provisioner`` naming one of these provisioners) and, its
  class waiting for the first consumer, the scheduler chose the node of its first pod
  (``volume.kubernetes.io/selected-node``). The volume is named ``pvc-<claim uid>`` and is
  ``hostPath: {path: <nodePath>/pvc-<uid>_<namespace>_<claim>, type: DirectoryOrCreate}``,
  pinned to that node by ``nodeAffinity`` (``kubernetes.io/hostname In [node]``), with the
  claim's request as capacity, its access modes and volume mode, the class's reclaim policy
  and mount options, and a ``claimRef`` to the claim so the PV controller binds the two.
  It is annotated ``pv.kubernetes.io/provisioned-by``, labelled with its node
  (``gpufleet.io/local-path-node``) and carries the finalizer
  ``gpufleet.io/local-path-cleanup``, which the node's agent removes once the directory is
  gone (gpufleet/agent/localpath.py). Events Provisioning and ProvisioningSucceeded go on
  the claim; what cannot be provisioned is a ProvisioningFailed event saying why. A node that
  does not exist is given back: the selected-node annotation is removed so the scheduler
  picks again.
- A Released volume it made, with reclaim policy Delete, is deleted (its directory follows
  through the finalizer).
- A bound claim of a class with ``allowVolumeExpansion: true`` that asks for more storage
  gets it: a directory has no size of its own, so the volume's capacity and the claim's
  ``status.capacity`` are raised to the request.
"""

from __future__ import annotations

import logging
import posixpath
from collections.abc import Hashable
from typing import Any

from gpufleet.api import storage
from gpufleet.api.k8s import Node, PersistentVolume, PersistentVolumeClaim, StorageClass
from gpufleet.client import objects
from gpufleet.client.api import Client
from gpufleet.client.controller import Requeue
from gpufleet.client.errors import AlreadyExists, ApiError, Conflict, NotFound, TransportError
from gpufleet.client.events import NORMAL, WARNING
from gpufleet.client.informer import SharedInformerFactory
from gpufleet.controllers._common import annotations_of, volume_claim_key
from gpufleet.controllers.base import QueueController

log = logging.getLogger(__name__)

COMPONENT = storage.LOCAL_PATH_PROVISIONER
CLAIM, VOLUME = "claim", "volume"


def default_class(node_path: str = storage.DEFAULT_NODE_PATH, *, default: bool = True) -> dict[str, Any]:
    """The StorageClass ``local-path`` made at start."""
    meta: dict[str, Any] = {"name": storage.LOCAL_PATH_CLASS}
    if default:
        meta["annotations"] = {storage.ANN_DEFAULT_CLASS: "true"}
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": meta,
        "provisioner": storage.LOCAL_PATH_PROVISIONER,
        "reclaimPolicy": storage.DELETE,
        "volumeBindingMode": storage.WAIT_FOR_FIRST_CONSUMER,
        "allowVolumeExpansion": True,
        "parameters": {storage.NODE_PATH_PARAMETER: node_path},
    }


def provisioned_volume(pvc: dict[str, Any], sc: dict[str, Any], node: str) -> dict[str, Any]:
    """The volume made for ``pvc`` of class ``sc`` on ``node`` (a pure function of the three)."""
    meta = pvc.get("metadata") or {}
    spec = pvc.get("spec") or {}
    name = storage.provisioned_volume_name(pvc)
    path = posixpath.join(storage.node_path(sc),
                          storage.local_path_dir_name(name, meta.get("namespace") or "", meta.get("name") or ""))
    request = ((spec.get("resources") or {}).get("requests") or {}).get("storage")
    pv_spec: dict[str, Any] = {
        "capacity": {"storage": request},
        "accessModes": list(spec.get("accessModes") or []),
        "persistentVolumeReclaimPolicy": sc.get("reclaimPolicy") or storage.DELETE,
        "storageClassName": sc["metadata"]["name"],
        "volumeMode": spec.get("volumeMode") or storage.FILESYSTEM,
        "hostPath": {"path": path, "type": "DirectoryOrCreate"},
        "nodeAffinity": storage.node_affinity_for(node),
        "claimRef": {"kind": "PersistentVolumeClaim", "apiVersion": "v1", "namespace": meta.get("namespace"),
                     "name": meta.get("name"), "uid": meta.get("uid"),
                     "resourceVersion": meta.get("resourceVersion")},
    }
    if sc.get("mountOptions"):
        pv_spec["mountOptions"] = list(sc["mountOptions"])
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": name,
            "annotations": {storage.ANN_PROVISIONED_BY: sc["provisioner"]},
            "labels": {storage.LOCAL_PATH_NODE_LABEL: node},
            "finalizers": [storage.LOCAL_PATH_CLEANUP_FINALIZER],
        },
        "spec": pv_spec,
    }


class LocalPathProvisioner(QueueController):
    name = "localpath"
    component = COMPONENT

    def __init__(
        self, client: Client, informers: SharedInformerFactory, *,
        node_path: str = storage.DEFAULT_NODE_PATH,
        **kwargs: Any,
    ) -> None:
        super().__init__(client, informers, **kwargs)
        self.node_path = node_path
        self.claims = informers.informer(PersistentVolumeClaim)
        self.volumes = informers.informer(PersistentVolume)
        self.classes = informers.informer(StorageClass)
        self.nodes = informers.informer(Node)
        self.claims.add_event_handler(self._claim, lambda old, new: self._claim(new))
        self.volumes.add_event_handler(self._volume, lambda old, new: self._volume(new))
        self.classes.add_event_handler(self._class, lambda old, new: self._class(new))

    async def start(self) -> None:
        try:
            await self.ensure_default_class()
        except (ApiError, TransportError) as exc:
            # Provisioning for the classes that exist must not wait for this one.
            log.warning("could not create the StorageClass %s: %s", storage.LOCAL_PATH_CLASS, exc)
        await super().start()

    async def ensure_default_class(self) -> None:
        """Create the class ``local-path`` if absent; the default only if no class is."""
        try:
            await self.client.get("storageclasses", storage.LOCAL_PATH_CLASS, raw=True)
            return
        except NotFound:
            pass
        existing = (await self.client.list("storageclasses", raw=True)).items
        body = default_class(self.node_path, default=storage.default_class(existing) is None)
        try:
            await self.client.create(body, raw=True)
            log.info("created the StorageClass %s (nodePath %s)", storage.LOCAL_PATH_CLASS, self.node_path)
        except AlreadyExists:
            pass

    # -- callbacks --------------------------------------------------------------------------------

    def _claim(self, pvc: Any) -> None:
        self.queue.add((CLAIM, objects.object_key(pvc)))

    def _volume(self, pv: Any) -> None:
        self.queue.add((VOLUME, objects.name_of(pv)))
        claim = volume_claim_key(pv)
        if claim:
            self.queue.add((CLAIM, claim))

    def _class(self, sc: Any) -> None:
        for pvc in self.claims.list():
            self._claim(pvc)

    # -- reconcile --------------------------------------------------------------------------------

    async def reconcile(self, key: Hashable) -> Requeue | None:
        kind, name = key  # type: ignore[misc]
        try:
            if kind == CLAIM:
                await self.sync_claim(name)
            else:
                await self.sync_volume(name)
        except Conflict:
            return Requeue()
        return None

    def _our_class(self, pvc: dict[str, Any]) -> dict[str, Any] | None:
        name = storage.claim_class(pvc)
        sc = self.classes.get(name) if name else None
        if sc is None or sc.provisioner not in storage.LOCAL_PATH_PROVISIONERS:
            return None
        return sc.to_dict()

    async def sync_claim(self, key: str) -> None:
        cached = self.claims.get(key)
        if cached is None:
            return
        pvc = cached.to_dict()
        if storage.being_deleted(pvc):
            return
        sc = self._our_class(pvc)
        if sc is None:
            return
        volume_name = (pvc.get("spec") or {}).get("volumeName")
        if volume_name:
            await self._expand(pvc, sc, volume_name)
            return
        annotations = annotations_of(pvc)
        handed = annotations.get(storage.ANN_STORAGE_PROVISIONER) or annotations.get(storage.ANN_BETA_STORAGE_PROVISIONER)
        if handed != sc["provisioner"]:
            return  # the PV controller has not asked for a volume (it may bind an existing one)
        if self.volumes.get(storage.provisioned_volume_name(pvc)) is not None:
            return  # made already; the PV controller binds it
        await self._provision(pvc, sc)

    async def _provision(self, pvc: dict[str, Any], sc: dict[str, Any]) -> None:
        spec = pvc.get("spec") or {}
        node = annotations_of(pvc).get(storage.ANN_SELECTED_NODE)
        if not storage.waits_for_first_consumer(sc):
            await self._failed(pvc, f"local-path volumes live on one node: storage class \"{sc['metadata']['name']}\" "
                                    "needs volumeBindingMode WaitForFirstConsumer so the scheduler picks the node")
            return
        if not node:
            return  # the scheduler has not placed the claim's first pod yet
        if spec.get("selector") is not None:
            await self._failed(pvc, "claim Selector is not supported")
            return
        if (spec.get("volumeMode") or storage.FILESYSTEM) != storage.FILESYSTEM:
            await self._failed(pvc, "local-path volumes support only volumeMode Filesystem")
            return
        if self.nodes.get(node) is None:
            await self._failed(pvc, f'node "{node}" not found')
            await self._give_back_node(pvc, node)
            return
        key = storage.claim_key(pvc)
        body = provisioned_volume(pvc, sc, node)
        await self.recorder.record(pvc, NORMAL, "Provisioning",
                                   f'External provisioner is provisioning volume for claim "{key}"')
        try:
            await self.client.create(body, raw=True)
        except AlreadyExists:
            return
        log.info("provisioned %s for claim %s on node %s at %s", body["metadata"]["name"], key, node,
                 body["spec"]["hostPath"]["path"])
        await self.recorder.record(pvc, NORMAL, "ProvisioningSucceeded",
                                   f"Successfully provisioned volume {body['metadata']['name']}")

    async def _failed(self, pvc: dict[str, Any], why: str) -> None:
        await self.recorder.record(pvc, WARNING, "ProvisioningFailed",
                                   f'failed to provision volume with StorageClass "{storage.claim_class(pvc)}": {why}')

    async def _give_back_node(self, pvc: dict[str, Any], node: str) -> None:
        body = objects.to_dict(pvc)
        annotations = annotations_of(pvc)
        if annotations.get(storage.ANN_SELECTED_NODE) != node:
            return
        annotations.pop(storage.ANN_SELECTED_NODE)
        body["metadata"]["annotations"] = annotations
        try:
            await self.client.update(body, raw=True)
        except NotFound:
            return

    async def _expand(self, pvc: dict[str, Any], sc: dict[str, Any], volume_name: str) -> None:
        if not sc.get("allowVolumeExpansion"):
            return
        cached = self.volumes.get(volume_name)
        if cached is None:
            return
        pv = cached.to_dict()
        if not storage.provisioned_locally(pv) or not storage.is_volume_bound_to_claim(pv, pvc):
            return
        request, capacity = storage.claim_request(pvc), storage.volume_capacity(pv)
        raw = ((pvc.get("spec") or {}).get("resources") or {}).get("requests", {}).get("storage")
        if request is None or raw is None:
            return
        if capacity is None or capacity < request:
            body = objects.to_dict(pv)
            body["spec"]["capacity"] = {"storage": raw}
            try:
                await self.client.update(body, raw=True)
            except NotFound:
                return
        status = dict(pvc.get("status") or {})
        have = storage.claim_request({"spec": {"resources": {"requests": status.get("capacity") or {}}}})
        if have is not None and have >= request:
            return
        body = objects.to_dict(pvc)
        body["status"] = {**status, "capacity": {"storage": raw}}
        try:
            await self.client.update_status(body, raw=True)
        except NotFound:
            return
        await self.recorder.record(pvc, NORMAL, "VolumeResizeSuccessful", "Resize volume succeeded")

    async def sync_volume(self, name: str) -> None:
        cached = self.volumes.get(name)
        if cached is None:
            return
        pv = cached.to_dict()
        if not storage.provisioned_locally(pv) or storage.being_deleted(pv):
            return
        spec, status = pv.get("spec") or {}, pv.get("status") or {}
        if status.get("phase") != storage.VOLUME_RELEASED or spec.get("persistentVolumeReclaimPolicy") != storage.DELETE:
            return
        try:
            await self.client.delete("persistentvolumes", name, preconditions_uid=pv["metadata"].get("uid"))
        except NotFound:
            return
        log.info("deleted released volume %s; its node removes %s", name, storage.volume_path(pv))
