"""PersistentVolume, PersistentVolumeClaim and StorageClass as the API holds them: defaults,
validation with Kubernetes' messages, printer columns, and the matching rules the PV
controller and the scheduler share (gpufleet.api.storage)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpufleet.api import k8s, storage
from gpufleet.api.defaults import apply_defaults
from gpufleet.api.registry import REGISTRY
from gpufleet.api.validation import validate_create, validate_update
from gpufleet.apiserver.tables import to_table

NOW = 1_700_000_000.0


def pvc_body(name: str = "data", **spec: Any) -> dict[str, Any]:
    body = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": "default", "uid": "u-1"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}
    body["spec"].update(spec)
    return body


def pv_body(name: str = "pv1", **spec: Any) -> dict[str, Any]:
    body = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "5Gi"},
                     "hostPath": {"path": "/data/pv1"}}}
    body["spec"].update(spec)
    return body


def sc_body(name: str = "fast", **fields: Any) -> dict[str, Any]:
    return {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": name},
            "provisioner": "gpufleet.io/local-path", **fields}


def messages(obj: Any, old: Any = None) -> list[str]:
    errs = validate_create(obj) if old is None else validate_update(obj, old)
    return [e.message() for e in errs]


def defaulted(model: type, body: dict[str, Any]) -> Any:
    obj = model.model_validate(body)
    apply_defaults(obj)
    return obj


# --- registry ------------------------------------------------------------------------------------


def test_the_kinds_are_served_with_kubernetes_names_scopes_and_short_names() -> None:
    pv = REGISTRY.resolve("pv")
    pvc = REGISTRY.resolve("pvc")
    sc = REGISTRY.resolve("sc")
    assert pv is not None and (pv.group, pv.version, pv.kind, pv.namespaced) == ("", "v1", "PersistentVolume", False)
    assert pvc is not None and (pvc.plural, pvc.namespaced) == ("persistentvolumeclaims", True)
    assert sc is not None and (sc.group, sc.plural, sc.namespaced) == ("storage.k8s.io", "storageclasses", False)
    assert "status" in pv.subresources and "status" in pvc.subresources
    assert sc.subresources == ()


# --- defaults ------------------------------------------------------------------------------------


def test_defaults_follow_kubernetes() -> None:
    pv = defaulted(k8s.PersistentVolume, pv_body())
    assert pv.spec.persistent_volume_reclaim_policy == "Retain"
    assert pv.spec.volume_mode == "Filesystem"
    assert pv.status.phase == "Pending"
    pvc = defaulted(k8s.PersistentVolumeClaim, pvc_body())
    assert pvc.spec.volume_mode == "Filesystem"
    assert pvc.status.phase == "Pending"
    sc = defaulted(k8s.StorageClass, sc_body())
    assert (sc.reclaim_policy, sc.volume_binding_mode) == ("Delete", "Immediate")


def test_defaults_keep_what_was_given() -> None:
    pv = defaulted(k8s.PersistentVolume, pv_body(persistentVolumeReclaimPolicy="Delete", volumeMode="Block"))
    assert (pv.spec.persistent_volume_reclaim_policy, pv.spec.volume_mode) == ("Delete", "Block")
    sc = defaulted(k8s.StorageClass, sc_body(reclaimPolicy="Retain", volumeBindingMode="WaitForFirstConsumer"))
    assert (sc.reclaim_policy, sc.volume_binding_mode) == ("Retain", "WaitForFirstConsumer")


# --- claims --------------------------------------------------------------------------------------


def test_a_claim_needs_access_modes_and_a_storage_request() -> None:
    body = pvc_body()
    body["spec"] = {}
    assert messages(defaulted(k8s.PersistentVolumeClaim, body)) == [
        "spec.accessModes: Required value: at least 1 access mode is required",
        "spec.resources[storage]: Required value",
    ]


def test_claim_values_are_checked() -> None:
    body = pvc_body(accessModes=["ReadWriteOncePod", "ReadWriteOnce", "Sometimes"], volumeMode="Raw",
                    storageClassName="Fast_Disks", resources={"requests": {"storage": "0"}})
    assert messages(defaulted(k8s.PersistentVolumeClaim, body)) == [
        'spec.accessModes: Unsupported value: "Sometimes": supported values: "ReadOnlyMany", "ReadWriteMany", '
        '"ReadWriteOnce", "ReadWriteOncePod"',
        "spec.accessModes: Forbidden: may not use ReadWriteOncePod with other access modes",
        'spec.resources[storage]: Invalid value: "0": must be greater than zero',
        'spec.storageClassName: Invalid value: "Fast_Disks": a lowercase RFC 1123 subdomain must consist of lower '
        "case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. "
        "'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*"
        "[a-z0-9])?)*')",
        'spec.volumeMode: Unsupported value: "Raw": supported values: "Block", "Filesystem"',
    ]


def test_a_claims_spec_is_immutable_except_its_volume_name_once() -> None:
    old = defaulted(k8s.PersistentVolumeClaim, pvc_body(storageClassName="fast"))
    named = copy.deepcopy(old)
    named.spec.volume_name = "pv1"
    assert messages(named, old) == []
    renamed = copy.deepcopy(named)
    renamed.spec.volume_name = "pv2"
    changed = copy.deepcopy(old)
    changed.spec.access_modes = ["ReadWriteMany"]
    for new, base in ((renamed, named), (changed, old)):
        errs = messages(new, base)
        assert len(errs) == 1
        assert errs[0].startswith("spec: Forbidden: spec is immutable after creation except resources.requests and "
                                  "volumeAttributesClassName for bound claims\n")
    assert '"pv1" -> "pv2"' in messages(renamed, named)[0]


def test_a_claim_without_a_class_may_be_given_one_later() -> None:
    old = defaulted(k8s.PersistentVolumeClaim, pvc_body())
    given = copy.deepcopy(old)
    given.spec.storage_class_name = "local-path"
    assert messages(given, old) == []
    changed = copy.deepcopy(given)
    changed.spec.storage_class_name = "other"
    assert messages(changed, given)[0].startswith("spec: Forbidden: spec is immutable")


def test_only_a_bound_claim_may_ask_for_more_and_never_for_less() -> None:
    old = defaulted(k8s.PersistentVolumeClaim, pvc_body(storageClassName="fast"))
    bigger = copy.deepcopy(old)
    bigger.spec.resources.requests = {"storage": "2Gi"}
    assert messages(bigger, old)[0].startswith("spec: Forbidden: spec is immutable")
    old.status.phase = "Bound"
    bigger.status.phase = "Bound"
    assert messages(bigger, old) == []
    smaller = copy.deepcopy(old)
    smaller.spec.resources.requests = {"storage": "500Mi"}
    assert messages(smaller, old) == ["spec.resources.requests.storage: Forbidden: field can not be less than "
                                      "previous value"]


# --- volumes ------------------------------------------------------------------------------------


def test_a_volume_needs_modes_capacity_and_one_source() -> None:
    body = pv_body()
    body["spec"] = {}
    assert messages(defaulted(k8s.PersistentVolume, body)) == [
        "spec.accessModes: Required value",
        "spec.capacity: Required value",
        'spec.capacity: Unsupported value: map[string]string{}: supported values: "storage"',
        "spec: Required value: must specify a volume type",
    ]


def test_volume_values_are_checked() -> None:
    body = pv_body(capacity={"storage": "-1"}, persistentVolumeReclaimPolicy="Shred",
                   hostPath={"path": "/data/../etc", "type": "Tunnel"}, local={"path": "relative"})
    assert messages(defaulted(k8s.PersistentVolume, body)) == [
        'spec.capacity[storage]: Invalid value: "-1": must be greater than zero',
        'spec.persistentVolumeReclaimPolicy: Unsupported value: "Shred": supported values: "Delete", "Recycle", '
        '"Retain"',
        "spec.local: Forbidden: may not specify more than 1 volume type",
        "spec.hostPath.path: Invalid value: \"/data/../etc\": must not contain '..'",
        'spec.hostPath.type: Unsupported value: "Tunnel": supported values: "", "BlockDevice", "CharDevice", '
        '"Directory", "DirectoryOrCreate", "File", "FileOrCreate", "Socket"',
        'spec.local.path: Invalid value: "relative": must be an absolute path',
        "spec.nodeAffinity: Required value: Local volume requires node affinity",
    ]


def test_volume_node_affinity_is_validated() -> None:
    body = pv_body(nodeAffinity={"required": {"nodeSelectorTerms": []}})
    assert messages(defaulted(k8s.PersistentVolume, body)) == [
        "spec.nodeAffinity.required.nodeSelectorTerms: Required value: must have at least one node selector term"]
    body = pv_body(nodeAffinity={})
    assert messages(defaulted(k8s.PersistentVolume, body)) == [
        "spec.nodeAffinity.required: Required value: must specify required node constraints"]


def test_a_volumes_source_is_immutable_its_claim_ref_is_not() -> None:
    old = defaulted(k8s.PersistentVolume, pv_body())
    claimed = copy.deepcopy(old)
    claimed.spec.claim_ref = k8s.ObjectReference(name="data", namespace="default")
    assert messages(claimed, old) == []
    moved = copy.deepcopy(old)
    moved.spec.host_path.path = "/data/other"
    errs = messages(moved, old)
    assert len(errs) == 1
    assert errs[0].startswith("spec.persistentvolumesource: Forbidden: spec.persistentvolumesource is immutable "
                              "after creation\n")


# --- classes -------------------------------------------------------------------------------------


def test_class_values_are_checked() -> None:
    body = sc_body(reclaimPolicy="Recycle", volumeBindingMode="Later", parameters={"": "x"})
    body["provisioner"] = ""
    assert messages(defaulted(k8s.StorageClass, body)) == [
        "provisioner: Required value",
        'parameters: Invalid value: "": field can not be empty.',
        'reclaimPolicy: Unsupported value: "Recycle": supported values: "Delete", "Retain"',
        'volumeBindingMode: Unsupported value: "Later": supported values: "Immediate", "WaitForFirstConsumer"',
    ]


def test_a_class_keeps_its_provisioner_parameters_policy_and_mode() -> None:
    old = defaulted(k8s.StorageClass, sc_body(parameters={"nodePath": "/a"}))
    new = copy.deepcopy(old)
    new.provisioner = "rancher.io/local-path"
    new.parameters = {"nodePath": "/b"}
    new.reclaim_policy = "Retain"
    new.volume_binding_mode = "WaitForFirstConsumer"
    assert messages(new, old) == [
        "parameters: Forbidden: updates to parameters are forbidden.",
        "provisioner: Forbidden: updates to provisioner are forbidden.",
        "reclaimPolicy: Forbidden: updates to reclaimPolicy are forbidden.",
        'volumeBindingMode: Invalid value: "WaitForFirstConsumer": field is immutable',
    ]
    relabelled = copy.deepcopy(old)
    relabelled.allow_volume_expansion = True
    assert messages(relabelled, old) == []


def test_a_pods_claim_volume_names_its_claim() -> None:
    pod = k8s.Pod.model_validate({"metadata": {"name": "p", "namespace": "default"}, "spec": {
        "containers": [{"name": "c", "image": "busybox"}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": ""}}]}})
    apply_defaults(pod)
    assert "spec.volumes[0].persistentVolumeClaim.claimName: Required value" in messages(pod)


# --- printer columns -----------------------------------------------------------------------------


def cells(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    rt = REGISTRY.resolve(kind)
    assert rt is not None
    table = to_table(rt, [obj], resource_version="1", now=NOW)
    names = [c["name"] for c in table["columnDefinitions"]]
    return dict(zip(names, table["rows"][0]["cells"], strict=True))


def test_pv_columns_as_kubectl_prints_them() -> None:
    pv = pv_body(accessModes=["ReadWriteMany", "ReadWriteOnce"], claimRef={"namespace": "ml", "name": "ckpt"},
                 storageClassName="local-path", persistentVolumeReclaimPolicy="Delete", volumeMode="Filesystem")
    pv["status"] = {"phase": "Bound"}
    row = cells("pv", pv)
    assert row == {"Name": "pv1", "Capacity": "5Gi", "Access Modes": "RWO,RWX", "Reclaim Policy": "Delete",
                   "Status": "Bound", "Claim": "ml/ckpt", "StorageClass": "local-path",
                   "VolumeAttributesClass": "<unset>", "Reason": "", "Age": "<unknown>", "VolumeMode": "Filesystem"}
    pv["metadata"]["deletionTimestamp"] = "2023-11-14T22:00:00Z"
    assert cells("pv", pv)["Status"] == "Terminating"


def test_pvc_columns_show_capacity_and_modes_only_once_bound() -> None:
    pvc = pvc_body(storageClassName="local-path", volumeMode="Filesystem")
    pvc["status"] = {"phase": "Pending"}
    assert cells("pvc", pvc) == {"Name": "data", "Status": "Pending", "Volume": "", "Capacity": "",
                                 "Access Modes": "", "StorageClass": "local-path", "VolumeAttributesClass": "<unset>",
                                 "Age": "<unknown>", "VolumeMode": "Filesystem"}
    pvc["spec"]["volumeName"] = "pvc-u-1"
    pvc["status"] = {"phase": "Bound", "capacity": {"storage": "2Gi"}, "accessModes": ["ReadWriteOnce"]}
    row = cells("pvc", pvc)
    assert (row["Status"], row["Volume"], row["Capacity"], row["Access Modes"]) == ("Bound", "pvc-u-1", "2Gi", "RWO")


def test_storage_class_columns_mark_the_default() -> None:
    sc = sc_body("local-path", reclaimPolicy="Delete", volumeBindingMode="WaitForFirstConsumer")
    sc["metadata"]["annotations"] = {storage.ANN_DEFAULT_CLASS: "true"}
    assert cells("sc", sc) == {"Name": "local-path (default)", "Provisioner": "gpufleet.io/local-path",
                               "ReclaimPolicy": "Delete", "VolumeBindingMode": "WaitForFirstConsumer",
                               "AllowVolumeExpansion": False, "Age": "<unknown>"}


# --- matching ------------------------------------------------------------------------------------


def available(body: dict[str, Any]) -> dict[str, Any]:
    body["status"] = {"phase": "Available"}
    return body


def test_the_smallest_volume_that_fits_is_chosen() -> None:
    claim = pvc_body(resources={"requests": {"storage": "2Gi"}})
    small = available(pv_body("small", capacity={"storage": "1Gi"}))
    large = available(pv_body("large", capacity={"storage": "10Gi"}))
    medium = available(pv_body("medium", capacity={"storage": "3Gi"}))
    assert storage.find_matching_volume(claim, [small, large, medium])["metadata"]["name"] == "medium"


@pytest.mark.parametrize(("volume", "why"), [
    (pv_body(storageClassName="fast"), "class"),
    (pv_body(accessModes=["ReadOnlyMany"]), "access modes"),
    (pv_body(volumeMode="Block"), "volume mode"),
    (pv_body(claimRef={"namespace": "default", "name": "other"}), "bound elsewhere"),
])
def test_volumes_that_do_not_satisfy_the_claim_are_passed_over(volume: dict[str, Any], why: str) -> None:
    assert storage.find_matching_volume(pvc_body(volumeMode="Filesystem"), [available(volume)]) is None, why


def test_a_selector_picks_among_volumes_by_label() -> None:
    claim = pvc_body(selector={"matchLabels": {"tier": "nvme"}})
    plain = available(pv_body("plain"))
    nvme = available(pv_body("nvme"))
    nvme["metadata"]["labels"] = {"tier": "nvme"}
    assert storage.find_matching_volume(claim, [plain, nvme])["metadata"]["name"] == "nvme"


def test_a_volume_pre_bound_to_the_claim_wins_even_when_waiting_for_a_consumer() -> None:
    claim = pvc_body()
    other = available(pv_body("other"))
    reserved = pv_body("reserved", claimRef={"namespace": "default", "name": "data"})
    assert storage.find_matching_volume(claim, [other, reserved], delay_binding=True)["metadata"]["name"] == "reserved"
    assert storage.find_matching_volume(claim, [other], delay_binding=True) is None


def test_node_affinity_limits_volumes_to_their_nodes() -> None:
    pinned = available(pv_body(nodeAffinity=storage.node_affinity_for("gpu-1")))
    claim = pvc_body()
    assert storage.find_matching_volume(claim, [pinned], node=("gpu-2", {storage.HOSTNAME_LABEL: "gpu-2"})) is None
    assert storage.find_matching_volume(claim, [pinned], node=("gpu-1", {storage.HOSTNAME_LABEL: "gpu-1"}))
    assert storage.pinned_nodes(pinned) == {"gpu-1"}
    # What was reserved for the claim binds wherever it lives, when the caller says so.
    reserved = pv_body("reserved", nodeAffinity=storage.node_affinity_for("gpu-1"),
                       claimRef={"namespace": "default", "name": "data"})
    elsewhere = ("gpu-2", {storage.HOSTNAME_LABEL: "gpu-2"})
    assert storage.find_matching_volume(claim, [reserved], node=elsewhere) is None
    assert storage.find_matching_volume(claim, [reserved], node=elsewhere, prebound_anywhere=True) is reserved


def test_a_pods_claims_include_generic_ephemeral_volumes() -> None:
    pod = {"metadata": {"name": "train"}, "spec": {"volumes": [
        {"name": "ckpt", "persistentVolumeClaim": {"claimName": "checkpoints"}},
        {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
        {"name": "tmp", "emptyDir": {}}]}}
    assert storage.pod_claim_names(pod) == ["checkpoints", "train-scratch"]


def test_only_scheduled_unfinished_pods_hold_a_claim() -> None:
    pod = {"metadata": {"name": "p"}, "spec": {"volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "c"}}]},
           "status": {"phase": "Pending"}}
    assert not storage.pod_uses_claim(pod, "c")
    pod["spec"]["nodeName"] = "n1"
    assert storage.pod_uses_claim(pod, "c")
    pod["status"]["phase"] = "Succeeded"
    assert not storage.pod_uses_claim(pod, "c")


def test_the_newest_default_class_is_the_default() -> None:
    older = sc_body("older")
    newer = sc_body("newer")
    plain = sc_body("plain")
    for sc, ts in ((older, "2024-01-01T00:00:00Z"), (newer, "2025-01-01T00:00:00Z"), (plain, "2026-01-01T00:00:00Z")):
        sc["metadata"]["creationTimestamp"] = ts
    for sc in (older, newer):
        sc["metadata"]["annotations"] = {storage.ANN_DEFAULT_CLASS: "true"}
    assert storage.default_class([older, plain, newer])["metadata"]["name"] == "newer"
    assert storage.default_class([plain]) is None


def test_the_cleanup_recognizes_only_provisioned_directories() -> None:
    name = "pvc-0f6e7d3c-1a2b-4c5d-8e9f-000000000001"
    assert storage.looks_provisioned(name, storage.local_path_dir_name(name, "ml", "ckpt"))
    assert not storage.looks_provisioned(name, name)
    assert not storage.looks_provisioned(name, "pvc-other_ml_ckpt")
    assert not storage.looks_provisioned("data", "data_ml_ckpt")
