"""The PV controller as plain decisions, a step at a time: a claim or a volume and what the
caches hold in; the next write, its Events and the step after it out."""

from __future__ import annotations

from typing import Any

from gpufleet.api import storage
from gpufleet.controllers.actions import Instant
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

NOW = Instant(1_700_000_000.0, "2023-11-14T22:13:20Z")


def pvc(name: str = "data", *, volume: str | None = None, bound: bool = False, phase: str | None = None,
        cls: str | None = None, annotations: dict[str, str] | None = None, **meta: Any) -> dict[str, Any]:
    ann = dict(annotations or {})
    if bound:
        ann[storage.ANN_BIND_COMPLETED] = "yes"
    spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    if volume:
        spec["volumeName"] = volume
    if cls is not None:
        spec["storageClassName"] = cls
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": "team", "uid": f"uid-{name}", "resourceVersion": "3",
                         "annotations": ann, **meta},
            "spec": spec, "status": {"phase": phase} if phase else {}}


def pv(name: str, size: str = "5Gi", *, claim: dict[str, Any] | None = None, phase: str | None = None,
       policy: str = "Retain", annotations: dict[str, str] | None = None, **meta: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"], "capacity": {"storage": size},
                            "persistentVolumeReclaimPolicy": policy, "hostPath": {"path": f"/srv/{name}"}}
    if claim is not None:
        m = claim["metadata"]
        spec["claimRef"] = {"kind": "PersistentVolumeClaim", "apiVersion": "v1", "namespace": m["namespace"],
                            "name": m["name"], "uid": m["uid"]}
    return {"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": name, "uid": f"uid-{name}", "annotations": dict(annotations or {}), **meta},
            "spec": spec, "status": {"phase": phase} if phase else {}}


def only_event(actions) -> tuple[str, str]:
    [e] = actions.events
    return e.type, e.reason


def test_an_unbound_claim_takes_the_smallest_fitting_volume_and_looks_again_later():
    claim = pvc(cls="")
    volumes = [pv("big", "10Gi", phase="Available"), pv("small", "2Gi", phase="Available"),
               pv("tiny", "500Mi", phase="Available")]
    actions = decide_claim(ClaimObserved(claim, volumes=volumes), NOW)
    assert actions.reason == "Bind" and actions.memo[BIND]["metadata"]["name"] == "small"
    assert actions.memo[UNBOUND] and actions.empty


def test_a_claim_without_volume_or_class_is_pending_and_says_so():
    actions = decide_claim(ClaimObserved(pvc(cls="")), NOW)
    assert only_event(actions) == ("Normal", "FailedBinding")
    assert actions.status == {"phase": "Pending"}


def test_a_claim_made_before_any_default_class_gets_it():
    default = {"metadata": {"name": "fast"}, "provisioner": "example.com/x"}
    actions = decide_claim(ClaimObserved(pvc(), default_class=default), NOW)
    [update] = actions.updates
    assert actions.reason == "DefaultClass" and update.body["spec"]["storageClassName"] == "fast"
    assert actions.status is None


def test_a_waiting_claim_names_its_pods_and_a_provisioned_class_gets_the_claim_handed_over():
    wffc = {"metadata": {"name": "local"}, "provisioner": storage.LOCAL_PATH_PROVISIONER,
            "volumeBindingMode": storage.WAIT_FOR_FIRST_CONSUMER}
    obs = ClaimObserved(pvc(cls="local"), storage_class=wffc, waiting_pods=["a", "b"])
    waiting = decide_claim(obs, NOW)
    assert [(e.reason, e.message) for e in waiting.events] == [
        ("WaitForPodScheduled", "waiting for pods a,b to be scheduled")]
    assert waiting.status == {"phase": "Pending"}
    selected = pvc(cls="local", annotations={storage.ANN_SELECTED_NODE: "gpu-1"})
    handed = decide_claim(ClaimObserved(selected, storage_class=wffc), NOW)
    assert handed.reason == "HandToProvisioner" and handed.events == []
    [update] = handed.updates
    ann = update.body["metadata"]["annotations"]
    assert ann[storage.ANN_STORAGE_PROVISIONER] == ann[storage.ANN_BETA_STORAGE_PROVISIONER] == wffc["provisioner"]
    assert update.event.reason == "ExternalProvisioning"  # recorded once the write succeeded
    missing = decide_claim(ClaimObserved(pvc(cls="gone")), NOW)
    assert only_event(missing) == ("Warning", "ProvisioningFailed") and missing.status == {"phase": "Pending"}


def test_a_claim_naming_a_volume_that_does_not_fit_says_why_and_one_bound_elsewhere_too():
    claim = pvc(volume="small", cls="")
    mismatch = decide_claim(ClaimObserved(claim, volume=pv("small", "100Mi")), NOW)
    assert only_event(mismatch) == ("Warning", "VolumeMismatch") and "small" in mismatch.events[0].message
    taken = decide_claim(ClaimObserved(claim, volume=pv("small", claim=pvc("other"))), NOW)
    assert only_event(taken) == ("Warning", "FailedBinding")
    fits = decide_claim(ClaimObserved(claim, volume=pv("small")), NOW)
    assert fits.memo[BIND]["metadata"]["name"] == "small"


def test_a_bound_claim_whose_volume_is_gone_or_taken_is_lost_once():
    claim = pvc(volume="v", bound=True, phase="Bound")
    lost = decide_claim(ClaimObserved(claim), NOW)
    assert lost.status == {"phase": "Lost"} and lost.events == []
    assert [(e.type, e.reason) for e in lost.memo[THEN]] == [("Warning", "ClaimLost")]
    misbound = decide_claim(ClaimObserved(claim, volume=pv("v", claim=pvc("other"))), NOW)
    assert misbound.reason == "ClaimMisbound"
    already = decide_claim(ClaimObserved(pvc(volume="v", bound=True, phase="Lost")), NOW)
    assert already.empty and THEN not in already.memo
    kept = decide_claim(ClaimObserved(claim, volume=pv("v", claim=claim)), NOW)
    assert kept.reason == "Bound" and kept.memo[BIND]["metadata"]["name"] == "v" and UNBOUND not in kept.memo


def test_a_claim_in_use_keeps_its_protection_and_the_api_has_the_last_word():
    deleting = pvc(deletionTimestamp="2026-01-01T00:00:00Z", finalizers=[storage.PVC_PROTECTION_FINALIZER])
    assert decide_claim(ClaimObserved(deleting, used=True), NOW).reason == "InUse"
    assert decide_claim(ClaimObserved(deleting), NOW).reason == CHECK_LIVE_PODS
    user = {"metadata": {"name": "p"}, "spec": {"nodeName": "gpu-1", "volumes": [
        {"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]}, "status": {"phase": "Running"}}
    assert decide_claim_protection(deleting, cached_users=False, live_pods=[user]).reason == "InUse"
    released = decide_claim_protection(deleting, cached_users=False, live_pods=[])
    assert released.reason == RELEASE_PROTECTION and released.updates[0].body["metadata"]["finalizers"] == []


def test_binding_writes_the_volume_then_the_claim_each_only_when_missing():
    claim, volume = pvc(cls=""), pv("v", phase="Available")
    ref = decide_volume_claim_ref(volume, claim)
    [update] = ref.updates
    assert update.body["spec"]["claimRef"] == {"kind": "PersistentVolumeClaim", "namespace": "team", "name": "data",
                                               "uid": "uid-data", "apiVersion": "v1", "resourceVersion": "3"}
    assert update.body["metadata"]["annotations"] == {storage.ANN_BOUND_BY_CONTROLLER: "yes"}
    assert volume["spec"].get("claimRef") is None  # the input is not touched
    bound_pv = update.body
    assert decide_volume_claim_ref(bound_pv, claim).empty
    phase = decide_volume_phase(bound_pv, storage.VOLUME_BOUND, NOW)
    assert phase.status == {"phase": "Bound", "lastPhaseTransitionTime": NOW.text}
    name = decide_claim_volume_name(claim, bound_pv)
    ann = name.updates[0].body["metadata"]["annotations"]
    assert name.updates[0].body["spec"]["volumeName"] == "v"
    assert ann == {storage.ANN_BIND_COMPLETED: "yes", storage.ANN_BOUND_BY_CONTROLLER: "yes"}
    bound_claim = name.updates[0].body
    assert decide_claim_volume_name(bound_claim, bound_pv).empty
    status = decide_claim_phase(bound_claim, storage.CLAIM_BOUND, bound_pv)
    assert status.status == {"phase": "Bound", "accessModes": ["ReadWriteOnce"], "capacity": {"storage": "5Gi"}}
    assert decide_claim_phase({**bound_claim, "status": status.status}, storage.CLAIM_BOUND, bound_pv).empty


def test_a_volume_is_available_bound_or_hands_a_binding_claim_back():
    assert decide_volume(pv("v"), None, NOW).status["phase"] == "Available"
    assert decide_volume(pv("v", phase="Available"), None, NOW).empty
    claim = pvc()
    assert decide_volume(pv("v", claim=claim), claim, NOW).memo == {ENQUEUE_CLAIM: "team/data"}
    mine = pvc(volume="v", bound=True)
    assert decide_volume(pv("v", claim=mine), mine, NOW).status["phase"] == "Bound"


def test_a_released_volume_is_reclaimed_by_its_policy():
    claim = pvc()
    retained = decide_volume(pv("v", claim=claim, phase="Bound"), None, NOW)
    assert retained.reason == RELEASE and retained.memo[NEXT] == RECLAIM
    assert retained.status["phase"] == "Released"
    assert decide_reclaim(pv("v", claim=claim, phase="Released"), NOW).empty
    delete = decide_volume(pv("v", claim=claim, phase="Released", policy="Delete"), None, NOW)
    assert delete.reason == "VolumeFailedDelete" and delete.status["phase"] == "Failed"
    assert "no deletable volume plugin matched" in delete.status["message"]
    assert [(e.type, e.reason) for e in delete.memo[THEN]] == [("Warning", "VolumeFailedDelete")]
    recycle = decide_reclaim(pv("v", phase="Released", policy="Recycle"), NOW)
    assert recycle.reason == "VolumeFailedRecycle"
    provisioned = pv("v", phase="Released", policy="Delete", annotations={storage.ANN_PROVISIONED_BY: "x"})
    assert decide_reclaim(provisioned, NOW).empty
    assert decide_reclaim(pv("v", phase="Failed", policy="Delete"), NOW).empty


def test_a_claim_that_moved_on_unbinds_a_volume_this_controller_bound():
    claim = pvc(volume="other", bound=True)
    ours = pv("v", claim=claim, phase="Bound", annotations={storage.ANN_BOUND_BY_CONTROLLER: "yes"})
    actions = decide_volume(ours, claim, NOW)
    [update] = actions.updates
    assert "claimRef" not in update.body["spec"] and update.body["metadata"]["annotations"] == {}
    assert actions.memo[NEXT] == storage.VOLUME_AVAILABLE
    assert decide_volume(pv("v", claim=claim, phase="Bound"), claim, NOW).empty


def test_a_bound_volume_keeps_its_protection():
    deleting = pv("v", phase="Bound", finalizers=[storage.PV_PROTECTION_FINALIZER],
                  deletionTimestamp="2026-01-01T00:00:00Z")
    assert decide_volume_protection(deleting).reason == "InUse"
    released = decide_volume_protection({**deleting, "status": {"phase": "Released"}})
    assert released.reason == RELEASE_PROTECTION and released.updates[0].body["metadata"]["finalizers"] == []
