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

The decisions are ``decide_claim`` (with ``decide_expand``) and ``decide_volume``: the claim
or volume and what the caches hold about it in; the volume to make, the Events, the writes
out, applied with ``actions.apply``.
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
from gpufleet.controllers.actions import Actions, Create, Delete, Event, Update, apply
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
        return sc.to_dict() if sc is not None else None

    async def sync_claim(self, key: str) -> None:
        cached = self.claims.get(key)
        if cached is None:
            return
        pvc = cached.to_dict()
        spec = pvc.get("spec") or {}
        wanted = spec.get("volumeName") or storage.provisioned_volume_name(pvc)
        volume = self.volumes.get(wanted)
        node = annotations_of(pvc).get(storage.ANN_SELECTED_NODE)
        actions = decide_claim(pvc, self._our_class(pvc), volume.to_dict() if volume is not None else None,
                               node_exists=bool(node) and self.nodes.get(node) is not None)
        try:
            outcome = await apply(self.client, actions, owner=pvc, recorder=self.recorder)
        except NotFound:
            return
        if actions.creates and VOLUME not in outcome.answers:
            return  # it was there already
        if actions.creates:
            body = actions.creates[0].body
            log.info("provisioned %s for claim %s on node %s at %s", body["metadata"]["name"], key, node,
                     body["spec"]["hostPath"]["path"])
        await apply(self.client, Actions(events=actions.memo.get(THEN, [])), owner=pvc, recorder=self.recorder)

    async def sync_volume(self, name: str) -> None:
        cached = self.volumes.get(name)
        if cached is None:
            return
        pv = cached.to_dict()
        actions = decide_volume(pv)
        outcome = await apply(self.client, actions)
        if outcome.deleted:
            log.info("deleted released volume %s; its node removes %s", name, storage.volume_path(pv))


# Events recorded once the decision's writes succeeded (its create created the volume).
THEN = "then"


def decide_claim(pvc: dict[str, Any], sc: dict[str, Any] | None, volume: dict[str, Any] | None, *,
                 node_exists: bool) -> Actions:
    """What a claim needs from this provisioner: ``sc`` its class (None when it has none),
    ``volume`` the volume it names (``spec.volumeName``) or else the one that would be made
    for it, ``node_exists`` whether its selected node is a Node. A bound claim of a class
    that allows it grows (``decide_expand``); a claim handed to this provisioner for a node
    gets its volume (Event Provisioning, the create, then Event ProvisioningSucceeded in
    ``memo[THEN]``); what cannot be provisioned is Event ProvisioningFailed, and a node that
    does not exist is given back (the selected-node annotation removed)."""
    if storage.being_deleted(pvc):
        return Actions(reason="Deleting")
    if sc is None or sc.get("provisioner") not in storage.LOCAL_PATH_PROVISIONERS:
        return Actions(reason="NotOurs")
    spec = pvc.get("spec") or {}
    if spec.get("volumeName"):
        return decide_expand(pvc, sc, volume)
    annotations = annotations_of(pvc)
    handed = annotations.get(storage.ANN_STORAGE_PROVISIONER) or annotations.get(storage.ANN_BETA_STORAGE_PROVISIONER)
    if handed != sc["provisioner"]:
        return Actions(reason="NotHanded")  # the PV controller has not asked for a volume (it may bind one)
    if volume is not None:
        return Actions(reason="Provisioned")  # made already; the PV controller binds it
    node = annotations.get(storage.ANN_SELECTED_NODE)
    if not storage.waits_for_first_consumer(sc):
        return _failed(pvc, f"local-path volumes live on one node: storage class \"{sc['metadata']['name']}\" "
                            "needs volumeBindingMode WaitForFirstConsumer so the scheduler picks the node")
    if not node:
        return Actions(reason="NoNode")  # the scheduler has not placed the claim's first pod yet
    if spec.get("selector") is not None:
        return _failed(pvc, "claim Selector is not supported")
    if (spec.get("volumeMode") or storage.FILESYSTEM) != storage.FILESYSTEM:
        return _failed(pvc, "local-path volumes support only volumeMode Filesystem")
    if not node_exists:
        actions = _failed(pvc, f'node "{node}" not found')
        body = objects.to_dict(pvc)
        body["metadata"]["annotations"] = {k: v for k, v in annotations.items() if k != storage.ANN_SELECTED_NODE}
        actions.updates.append(Update(body))
        actions.reason = "GiveBackNode"
        return actions
    body = provisioned_volume(pvc, sc, node)
    actions = Actions(creates=[Create(body, on_exists="ignore", tag=VOLUME)], reason="Provision",
                      memo={THEN: [Event(NORMAL, "ProvisioningSucceeded",
                                         f"Successfully provisioned volume {body['metadata']['name']}")]})
    actions.event(NORMAL, "Provisioning",
                  f'External provisioner is provisioning volume for claim "{storage.claim_key(pvc)}"')
    return actions


def _failed(pvc: dict[str, Any], why: str) -> Actions:
    actions = Actions(reason="ProvisioningFailed")
    actions.event(WARNING, "ProvisioningFailed",
                  f'failed to provision volume with StorageClass "{storage.claim_class(pvc)}": {why}')
    return actions


def decide_expand(pvc: dict[str, Any], sc: dict[str, Any], pv: dict[str, Any] | None) -> Actions:
    """A bound claim asking for more than it has, its class allowing expansion, its volume one
    of this provisioner's bound to it: the volume's capacity raised to the request (when
    less), then the claim's ``status.capacity`` (when less), with Event
    VolumeResizeSuccessful in ``memo[THEN]``."""
    if not sc.get("allowVolumeExpansion"):
        return Actions(reason="NoExpansion")
    if pv is None or not storage.provisioned_locally(pv) or not storage.is_volume_bound_to_claim(pv, pvc):
        return Actions(reason="NotOurVolume")
    request, capacity = storage.claim_request(pvc), storage.volume_capacity(pv)
    raw = ((pvc.get("spec") or {}).get("resources") or {}).get("requests", {}).get("storage")
    if request is None or raw is None:
        return Actions(reason="NoRequest")
    actions = Actions(reason="Expanded")
    if capacity is None or capacity < request:
        body = objects.to_dict(pv)
        body["spec"]["capacity"] = {"storage": raw}
        actions.updates.append(Update(body))
        actions.reason = "Expand"
    status = dict(pvc.get("status") or {})
    have = storage.claim_request({"spec": {"resources": {"requests": status.get("capacity") or {}}}})
    if have is not None and have >= request:
        return actions
    actions.status = {**status, "capacity": {"storage": raw}}
    actions.memo[THEN] = [Event(NORMAL, "VolumeResizeSuccessful", "Resize volume succeeded")]
    actions.reason = "Expand"
    return actions


def decide_volume(pv: dict[str, Any]) -> Actions:
    """A Released volume this provisioner made, reclaim policy Delete, not being deleted yet:
    deleted on its uid (its directory follows through the cleanup finalizer)."""
    if not storage.provisioned_locally(pv) or storage.being_deleted(pv):
        return Actions(reason="NotOurs")
    spec, status = pv.get("spec") or {}, pv.get("status") or {}
    if status.get("phase") != storage.VOLUME_RELEASED or spec.get("persistentVolumeReclaimPolicy") != storage.DELETE:
        return Actions(reason="Kept")
    meta = pv["metadata"]
    return Actions(deletes=[Delete("persistentvolumes", meta["name"], None, uid=meta.get("uid"))], reason="Reclaim")
