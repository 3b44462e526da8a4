"""The PV controller's decisions: a claim or a volume and what the caches hold about it in;
``Actions`` out, touching nothing (the rules are in persistentvolume.py's docstring).

Binding and reclaim are chains of compare-and-swap writes, each made on the answer of the
one before, so they are decided a step at a time: ``decide_claim`` and ``decide_volume``
decide the first step (and name what comes next in ``memo``: ``BIND`` the volume to bind,
``NEXT`` the step after a volume's write), then ``decide_volume_claim_ref`` ->
``decide_volume_phase`` -> ``decide_claim_volume_name`` -> ``decide_claim_phase`` bind, and
``decide_reclaim`` reclaims a Released volume. Each step holds at most one write; Events that
Kubernetes records once a write succeeded are in ``memo[THEN]``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gpufleet.api import storage
from gpufleet.client import objects
from gpufleet.client.events import NORMAL, WARNING
from gpufleet.controllers._common import annotations_of
from gpufleet.controllers.actions import Actions, Event, Instant, Update

YES = "yes"
# memo keys: the volume to bind, the claim to sync, a claim sync that may look again later,
# what follows a volume's write, the Events recorded once the write succeeded.
BIND, ENQUEUE_CLAIM, UNBOUND, NEXT, THEN = "bind", "enqueueClaim", "unbound", "next", "then"
RECLAIM = "reclaim"
# reasons the controller acts on
CHECK_LIVE_PODS, RELEASE_PROTECTION, RELEASE, RELEASE_MOVED = (
    "CheckLivePods", "ReleaseProtection", "Release", "ReleaseMoved")


@dataclass(frozen=True)
class ClaimObserved:
    """What a claim's sync reads: the claim; the volume it names (None when it names none or
    that one is gone); its class; every volume and the default class (read only for a claim
    not bound yet); the labels of its selected node; the names of its pods not scheduled yet;
    whether a cached pod uses it."""

    pvc: dict[str, Any]
    volume: dict[str, Any] | None = None
    storage_class: dict[str, Any] | None = None
    volumes: list[dict[str, Any]] = field(default_factory=list)
    default_class: dict[str, Any] | None = None
    node_labels: dict[str, str] = field(default_factory=dict)
    waiting_pods: list[str] = field(default_factory=list)
    used: bool = False


def _copy(obj: dict[str, Any]) -> dict[str, Any]:
    body = objects.to_dict(obj)
    body.setdefault("metadata", {})
    body.setdefault("spec", {})
    return body


def _event(actions: Actions, type_: str, reason: str, message: str) -> Actions:
    actions.event(type_, reason, message)
    return actions


# -- claims ---------------------------------------------------------------------------------------

def decide_claim(obs: ClaimObserved, now: Instant) -> Actions:
    """A claim's first step: protection while it is being deleted, keeping a bound claim
    bound (or Lost), finding an unbound claim its volume or the way to one."""
    pvc = obs.pvc
    if storage.being_deleted(pvc):
        return decide_claim_protection(pvc, cached_users=obs.used)
    if storage.ANN_BIND_COMPLETED in annotations_of(pvc):
        return _bound_claim(obs)
    actions = _unbound_claim(obs)
    actions.memo[UNBOUND] = True
    return actions


def decide_claim_protection(pvc: dict[str, Any], *, cached_users: bool,
                            live_pods: Iterable[dict[str, Any]] | None = None) -> Actions:
    """A claim being deleted keeps its protection finalizer while a pod uses it: the cache is
    asked first, then the API (``live_pods``; reason ``CHECK_LIVE_PODS`` until it is given)."""
    meta = pvc.get("metadata") or {}
    finalizers = list(meta.get("finalizers") or [])
    if storage.PVC_PROTECTION_FINALIZER not in finalizers:
        return Actions(reason="Unprotected")
    if cached_users:
        return Actions(reason="InUse")
    if live_pods is None:
        return Actions(reason=CHECK_LIVE_PODS)
    if any(storage.pod_uses_claim(p, meta.get("name") or "") for p in live_pods):
        return Actions(reason="InUse")
    body = _copy(pvc)
    body["metadata"]["finalizers"] = [f for f in finalizers if f != storage.PVC_PROTECTION_FINALIZER]
    return Actions(updates=[Update(body)], reason=RELEASE_PROTECTION)


def _bound_claim(obs: ClaimObserved) -> Actions:
    pvc, pv = obs.pvc, obs.volume
    if not (pvc.get("spec") or {}).get("volumeName"):
        return _lose(pvc, "ClaimLost", "Bound claim has lost reference to PersistentVolume. Data on the volume is lost!")
    if pv is None:
        return _lose(pvc, "ClaimLost", "Bound claim has lost its PersistentVolume. Data on the volume is lost!")
    ref = (pv.get("spec") or {}).get("claimRef")
    if not ref or ref.get("uid") == (pvc.get("metadata") or {}).get("uid"):
        return Actions(reason="Bound", memo={BIND: dict(pv)})
    return _lose(pvc, "ClaimMisbound", "Two claims are bound to the same volume, this one is bound incorrectly")


def _lose(pvc: dict[str, Any], reason: str, message: str) -> Actions:
    if (pvc.get("status") or {}).get("phase") == storage.CLAIM_LOST:
        return Actions(reason="Lost")
    actions = decide_claim_phase(pvc, storage.CLAIM_LOST)
    actions.reason = reason
    actions.memo[THEN] = [Event(WARNING, reason, message)]
    return actions


def _pending(pvc: dict[str, Any], reason: str, *event: str) -> Actions:
    actions = decide_claim_phase(pvc, storage.CLAIM_PENDING)
    actions.reason = reason
    if event:
        actions.event(*event)
    return actions


def _unbound_claim(obs: ClaimObserved) -> Actions:
    pvc = obs.pvc
    volume_name = (pvc.get("spec") or {}).get("volumeName") or ""
    if volume_name:
        return _requested_volume(obs, volume_name)
    sc = obs.storage_class
    delayed = storage.waits_for_first_consumer(sc)
    selected = annotations_of(pvc).get(storage.ANN_SELECTED_NODE)
    node = (selected, dict(obs.node_labels)) if delayed and selected else None
    volume = storage.find_matching_volume(pvc, obs.volumes, delay_binding=delayed and not selected,
                                          node=node, prebound_anywhere=True)
    if volume is not None:
        return Actions(reason="Bind", memo={BIND: dict(volume)})
    if storage.claim_class_unset(pvc) and obs.default_class is not None:
        body = _copy(pvc)
        body["spec"]["storageClassName"] = obs.default_class["metadata"]["name"]
        return Actions(updates=[Update(body)], reason="DefaultClass")
    if delayed and not selected:
        waiting = obs.waiting_pods
        if not waiting:
            return _pending(pvc, "WaitForFirstConsumer", NORMAL, "WaitForFirstConsumer",
                            "waiting for first consumer to be created before binding")
        if len(waiting) == 1:
            return _pending(pvc, "WaitForPodScheduled", NORMAL, "WaitForPodScheduled",
                            f"waiting for pod {waiting[0]} to be scheduled")
        return _pending(pvc, "WaitForPodScheduled", NORMAL, "WaitForPodScheduled",
                        f"waiting for pods {','.join(waiting)} to be scheduled")
    if storage.claim_class(pvc):
        return _hand_to_provisioner(pvc, sc)
    return _pending(pvc, "NoClass", NORMAL, "FailedBinding",
                    "no persistent volumes available for this claim and no storage class is set")


def _requested_volume(obs: ClaimObserved, volume_name: str) -> Actions:
    """The claim names its volume (a user's pre-binding, or a binding this controller started
    and must finish)."""
    pvc, pv = obs.pvc, obs.volume
    if pv is None:
        return _pending(pvc, "VolumeMissing")
    ref = (pv.get("spec") or {}).get("claimRef")
    if not ref:
        why = storage.mismatch(pv, pvc)
        if why is not None:
            return _pending(pvc, "VolumeMismatch", WARNING, "VolumeMismatch",
                            f'Cannot bind to requested volume "{volume_name}": {why}')
        return Actions(reason="Bind", memo={BIND: dict(pv)})
    if storage.is_volume_bound_to_claim(pv, pvc):
        return Actions(reason="Bind", memo={BIND: dict(pv)})
    return _pending(pvc, "BoundElsewhere", WARNING, "FailedBinding",
                    f'volume "{volume_name}" already bound to a different claim.')


def _hand_to_provisioner(pvc: dict[str, Any], sc: dict[str, Any] | None) -> Actions:
    class_name = storage.claim_class(pvc)
    if sc is None:
        return _pending(pvc, "ClassNotFound", WARNING, "ProvisioningFailed",
                        f'storageclass.storage.k8s.io "{class_name}" not found')
    if not storage.can_provision(sc):
        return _pending(
            pvc, "NoProvisioner", NORMAL, "FailedBinding",
            f'no persistent volumes available for this claim and storage class "{class_name}" does not provision '
            "volumes (provisioner kubernetes.io/no-provisioner): create a matching PersistentVolume")
    provisioner = sc["provisioner"]
    handed = Event(NORMAL, "ExternalProvisioning",
                   f"Waiting for a volume to be created either by the external provisioner '{provisioner}' or "
                   "manually by the system administrator. If volume creation is delayed, please verify that the "
                   "provisioner is running and correctly registered.")
    annotations = annotations_of(pvc)
    if (annotations.get(storage.ANN_STORAGE_PROVISIONER), annotations.get(storage.ANN_BETA_STORAGE_PROVISIONER)) \
            == (provisioner, provisioner):
        return Actions(events=[handed], reason="Provisioning")
    body = _copy(pvc)
    body["metadata"]["annotations"] = {**annotations, storage.ANN_STORAGE_PROVISIONER: provisioner,
                                       storage.ANN_BETA_STORAGE_PROVISIONER: provisioner}
    return Actions(updates=[Update(body, event=handed)], reason="HandToProvisioner")


def decide_claim_phase(pvc: dict[str, Any], phase: str, pv: dict[str, Any] | None = None) -> Actions:
    """The claim's status in ``phase``; Bound to ``pv`` it carries the volume's access modes and
    capacity, otherwise neither. Nothing when it is so already."""
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
        return Actions(reason="InPhase")
    return Actions(status=wanted, reason=f"Claim{phase}")


def decide_claim_volume_name(pvc: dict[str, Any], pv: dict[str, Any]) -> Actions:
    """The claim's side of a binding: ``spec.volumeName`` with bind-completed (and
    bound-by-controller when this controller chose the volume)."""
    name = pv["metadata"]["name"]
    annotations = annotations_of(pvc)
    spec = pvc.get("spec") or {}
    if spec.get("volumeName") == name and annotations.get(storage.ANN_BIND_COMPLETED) == YES:
        return Actions(reason="ClaimBound")
    body = _copy(pvc)
    if not spec.get("volumeName"):
        annotations[storage.ANN_BOUND_BY_CONTROLLER] = YES
    body["spec"]["volumeName"] = name
    annotations[storage.ANN_BIND_COMPLETED] = YES
    body["metadata"]["annotations"] = annotations
    return Actions(updates=[Update(body)], reason="BindClaim")


# -- volumes --------------------------------------------------------------------------------------

def decide_volume_claim_ref(pv: dict[str, Any], pvc: dict[str, Any]) -> Actions:
    """The volume's side of a binding: its ``claimRef`` naming the claim (bound-by-controller
    when it named none before)."""
    meta = pvc.get("metadata") or {}
    ref = (pv.get("spec") or {}).get("claimRef")
    wanted = {"kind": "PersistentVolumeClaim", "namespace": meta.get("namespace"), "name": meta.get("name"),
              "uid": meta.get("uid"), "apiVersion": "v1", "resourceVersion": meta.get("resourceVersion")}
    if ref and all(ref.get(k) == wanted[k] for k in ("kind", "namespace", "name", "uid", "apiVersion")):
        return Actions(reason="VolumeBound")
    body = _copy(pv)
    body["spec"]["claimRef"] = {k: v for k, v in wanted.items() if v}
    if not ref:
        body["metadata"]["annotations"] = {**annotations_of(pv), storage.ANN_BOUND_BY_CONTROLLER: YES}
    return Actions(updates=[Update(body)], reason="BindVolume")


def decide_volume_phase(pv: dict[str, Any], phase: str, now: Instant, message: str = "") -> Actions:
    """The volume's status in ``phase`` with ``message`` (lastPhaseTransitionTime when the phase
    changes). Nothing when it is so already."""
    status = dict(pv.get("status") or {})
    if status.get("phase") == phase and (status.get("message") or "") == message:
        return Actions(reason="InPhase")
    wanted = dict(status, phase=phase)
    if message:
        wanted["message"] = message
    else:
        wanted.pop("message", None)
    if status.get("phase") != phase:
        wanted["lastPhaseTransitionTime"] = now.text
    return Actions(status=wanted, reason=f"Volume{phase}")


def decide_volume_protection(pv: dict[str, Any]) -> Actions:
    """A volume being deleted keeps its protection finalizer while it is Bound."""
    finalizers = list((pv.get("metadata") or {}).get("finalizers") or [])
    if storage.PV_PROTECTION_FINALIZER not in finalizers:
        return Actions(reason="Unprotected")
    if (pv.get("status") or {}).get("phase") == storage.VOLUME_BOUND:
        return Actions(reason="InUse")
    body = _copy(pv)
    body["metadata"]["finalizers"] = [f for f in finalizers if f != storage.PV_PROTECTION_FINALIZER]
    return Actions(updates=[Update(body)], reason=RELEASE_PROTECTION)


def _release(pv: dict[str, Any], now: Instant, reason: str) -> Actions:
    if (pv.get("status") or {}).get("phase") in (storage.VOLUME_RELEASED, storage.VOLUME_FAILED):
        return decide_reclaim(pv, now)
    actions = decide_volume_phase(pv, storage.VOLUME_RELEASED, now)
    actions.reason = reason
    actions.memo[NEXT] = RECLAIM
    return actions


def decide_volume(pv: dict[str, Any], claim: dict[str, Any] | None, now: Instant) -> Actions:
    """A volume's first step, ``claim`` being the claim its claimRef names (None when that is
    gone): Available while free or pre-bound; Released (then reclaimed) once its claim is
    gone; Bound while its claim names it; a claim still binding is synced; a claim that went
    to another volume releases a provisioned volume of policy Delete, or unbinds one this
    controller bound (then Available)."""
    ref = (pv.get("spec") or {}).get("claimRef")
    if not ref or not ref.get("uid"):
        # Free, or pre-bound to a claim that has not been bound to it yet.
        return decide_volume_phase(pv, storage.VOLUME_AVAILABLE, now)
    if claim is None:
        return _release(pv, now, RELEASE)
    volume_name = (claim.get("spec") or {}).get("volumeName") or ""
    if not volume_name:
        # Pre-bound or provisioned for the claim: the claim's sync finishes the binding.
        return Actions(reason="ClaimBinding", memo={ENQUEUE_CLAIM: storage.claim_key(claim)})
    if volume_name == pv["metadata"]["name"]:
        return decide_volume_phase(pv, storage.VOLUME_BOUND, now)
    # The claim went to another volume.
    if storage.provisioned_by(pv) and (pv.get("spec") or {}).get("persistentVolumeReclaimPolicy") == storage.DELETE:
        return _release(pv, now, RELEASE_MOVED)
    if not annotations_of(pv).get(storage.ANN_BOUND_BY_CONTROLLER):
        return Actions(reason="BoundByUser")
    body = _copy(pv)
    body["spec"].pop("claimRef", None)
    annotations = annotations_of(pv)
    annotations.pop(storage.ANN_BOUND_BY_CONTROLLER, None)
    body["metadata"]["annotations"] = annotations
    return Actions(updates=[Update(body)], reason="Unbind", memo={NEXT: storage.VOLUME_AVAILABLE})


def decide_reclaim(pv: dict[str, Any], now: Instant) -> Actions:
    """A Released volume's reclaim policy: Retain keeps it; Delete of a provisioned volume is its
    provisioner's; any other Delete, and Recycle, fail (phase Failed, then a Warning)."""
    policy = (pv.get("spec") or {}).get("persistentVolumeReclaimPolicy") or storage.RETAIN
    name = pv["metadata"]["name"]
    if policy == storage.RETAIN:
        return Actions(reason="Retain")
    if policy == storage.DELETE and storage.provisioned_by(pv):
        return Actions(reason="Provisioner")  # the provisioner that made it deletes it, with its data
    if (pv.get("status") or {}).get("phase") == storage.VOLUME_FAILED:
        return Actions(reason="Failed")
    if policy == storage.DELETE:
        reason = "VolumeFailedDelete"
        message = f'error getting deleter volume plugin for volume "{name}": no deletable volume plugin matched'
    else:
        reason, message = "VolumeFailedRecycle", "No recycler plugin found for the volume!"
    actions = decide_volume_phase(pv, storage.VOLUME_FAILED, now, message)
    actions.reason = reason
    actions.memo[THEN] = [Event(WARNING, reason, message)]
    return actions
