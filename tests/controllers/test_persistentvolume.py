"""The PV controller and the local-path provisioner against a real control plane: binding,
phases and events as Kubernetes has them, reclaim, protection, provisioning for the node the
scheduler chose (set by hand here), expansion and the default class."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from ctrl_helpers import NS, events_for, eventually, pod, set_pod_status

from gpufleet.api import storage
from gpufleet.client.api import Client
from gpufleet.client.errors import Forbidden, NotFound

PV_CONTROLLERS = ("persistentvolume",)
STORAGE = ("persistentvolume", "localpath")
CLAIMS, VOLUMES, CLASSES = "persistentvolumeclaims", "persistentvolumes", "storageclasses"


def claim(name: str = "data", size: str = "1Gi", *, node: str | None = None, **spec: Any) -> dict[str, Any]:
    """A claim; ``node`` is what the scheduler would have chosen for its first pod."""
    meta: dict[str, Any] = {"name": name, "namespace": NS}
    if node:
        meta["annotations"] = {storage.ANN_SELECTED_NODE: node}
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta,
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}, **spec}}


def volume(name: str, size: str = "5Gi", *, policy: str = "Retain", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteOnce"], "capacity": {"storage": size},
                     "hostPath": {"path": f"/srv/{name}"}, "persistentVolumeReclaimPolicy": policy, **spec}}


def node_object(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {storage.HOSTNAME_LABEL: name}}}


async def get_claim(client: Client, name: str = "data") -> dict[str, Any]:
    return await client.get(CLAIMS, name, NS, raw=True)


async def get_volume(client: Client, name: str) -> dict[str, Any]:
    return await client.get(VOLUMES, name, raw=True)


async def phase_of(client: Client, kind: str, name: str) -> str | None:
    try:
        obj = await client.get(kind, name, NS if kind == CLAIMS else None, raw=True)
    except NotFound:
        return None
    return (obj.get("status") or {}).get("phase")


async def absent(client: Client, kind: str, name: str) -> bool:
    try:
        await client.get(kind, name, NS if kind == CLAIMS else None, raw=True)
    except NotFound:
        return True
    return False


async def reasons(client: Client, name: str) -> list[str]:
    return [e["reason"] for e in await events_for(client, name)]


# -- binding ----------------------------------------------------------------------------------


async def test_a_claim_binds_to_the_smallest_fitting_volume(client: Client, controllers) -> None:
    await controllers(enabled=PV_CONTROLLERS)
    for name, size in (("small", "500Mi"), ("big", "100Gi"), ("right", "5Gi")):
        await client.create(volume(name, size), raw=True)
    await all_available(client, "small", "big", "right")
    await client.create(claim(storageClassName=""), raw=True)
    await eventually(lambda: _is(phase_of(client, CLAIMS, "data"), "Bound"), what="the claim to bind")
    pvc = await get_claim(client)
    assert pvc["spec"]["volumeName"] == "right"
    assert pvc["metadata"]["annotations"] == {storage.ANN_BIND_COMPLETED: "yes", storage.ANN_BOUND_BY_CONTROLLER: "yes"}
    assert pvc["status"] == {"phase": "Bound", "accessModes": ["ReadWriteOnce"], "capacity": {"storage": "5Gi"}}
    pv = await get_volume(client, "right")
    assert pv["status"]["phase"] == "Bound"
    assert pv["spec"]["claimRef"]["uid"] == pvc["metadata"]["uid"]
    assert pv["metadata"]["annotations"] == {storage.ANN_BOUND_BY_CONTROLLER: "yes"}
    assert await phase_of(client, VOLUMES, "small") == "Available"


async def _is(value: Any, wanted: Any) -> bool:
    return (await value) == wanted


async def all_available(client: Client, *names: str) -> None:
    for name in names:
        await eventually(lambda name=name: _is(phase_of(client, VOLUMES, name), "Available"),
                         what=f"volume {name} to be Available")


async def test_a_volume_reserved_for_a_claim_wins(client: Client, controllers) -> None:
    await controllers(enabled=PV_CONTROLLERS)
    await client.create(volume("any", "1Gi"), raw=True)
    await client.create(volume("reserved", "10Gi", claimRef={"namespace": NS, "name": "data"}), raw=True)
    await all_available(client, "any", "reserved")
    await client.create(claim(storageClassName=""), raw=True)
    await eventually(lambda: _is(phase_of(client, CLAIMS, "data"), "Bound"), what="the claim to bind")
    assert (await get_claim(client))["spec"]["volumeName"] == "reserved"
    # Reserved by its administrator, not chosen by the controller.
    assert storage.ANN_BOUND_BY_CONTROLLER not in ((await get_volume(client, "reserved"))["metadata"]
                                                   .get("annotations") or {})


async def test_a_claim_naming_a_volume_that_does_not_fit_says_why(client: Client, controllers) -> None:
    await controllers(enabled=PV_CONTROLLERS)
    await client.create(volume("tiny", "100Mi"), raw=True)
    await client.create(claim(storageClassName="", volumeName="tiny"), raw=True)
    events = await eventually(lambda: events_for(client, "data", "VolumeMismatch"), what="a VolumeMismatch event")
    assert events[0]["message"] == 'Cannot bind to requested volume "tiny": requested PV is too small'
    assert await phase_of(client, CLAIMS, "data") == "Pending"


async def test_a_claim_without_class_or_volume_waits_and_says_so(client: Client, controllers) -> None:
    await controllers(enabled=PV_CONTROLLERS)
    await client.create(claim(storageClassName=""), raw=True)
    events = await eventually(lambda: events_for(client, "data", "FailedBinding"), what="a FailedBinding event")
    assert events[0]["message"] == "no persistent volumes available for this claim and no storage class is set"
    await client.create(claim("missing", storageClassName="gold"), raw=True)
    events = await eventually(lambda: events_for(client, "missing", "ProvisioningFailed"), what="ProvisioningFailed")
    assert events[0]["message"] == 'storageclass.storage.k8s.io "gold" not found'


# -- reclaim and protection ------------------------------------------------------------------


async def bound_pair(client: Client, pv: dict[str, Any]) -> dict[str, Any]:
    await client.create(pv, raw=True)
    await client.create(claim(storageClassName=""), raw=True)
    await eventually(lambda: _is(phase_of(client, VOLUMES, pv["metadata"]["name"]), "Bound"), what="binding")
    return await get_claim(client)


async def test_retain_keeps_a_released_volume(client: Client, controllers) -> None:
    await controllers(enabled=PV_CONTROLLERS)
    await bound_pair(client, volume("keep", policy="Retain"))
    await client.delete(CLAIMS, "data", NS)
    await eventually(lambda: _is(phase_of(client, VOLUMES, "keep"), "Released"), what="the volume to be released")
    assert (await get_volume(client, "keep"))["spec"]["claimRef"]["name"] == "data"


async def test_delete_fails_for_a_volume_no_provisioner_made(client: Client, controllers) -> None:
    await controllers(enabled=PV_CONTROLLERS)
    await bound_pair(client, volume("manual", policy="Delete"))
    await client.delete(CLAIMS, "data", NS)
    await eventually(lambda: _is(phase_of(client, VOLUMES, "manual"), "Failed"), what="the volume to fail")
    pv = await get_volume(client, "manual")
    message = 'error getting deleter volume plugin for volume "manual": no deletable volume plugin matched'
    assert pv["status"]["message"] == message
    assert [e["message"] for e in await events_for(client, "manual", "VolumeFailedDelete")] == [message]


async def test_a_claim_in_use_stays_until_its_pod_is_done(client: Client, controllers) -> None:
    await controllers(enabled=PV_CONTROLLERS)
    pvc = await bound_pair(client, volume("used"))
    assert pvc["metadata"]["finalizers"] == [storage.PVC_PROTECTION_FINALIZER]
    await client.create(pod("train", node="n1", volumes=[{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]),
                        raw=True)
    await set_pod_status(client, "train")
    await client.delete(CLAIMS, "data", NS)
    deleting = await get_claim(client)
    assert deleting["metadata"]["deletionTimestamp"]
    # Give the controller every chance to get it wrong before the pod finishes.
    await client.create(claim("nudge", storageClassName=""), raw=True)
    await eventually(lambda: events_for(client, "nudge", "FailedBinding"), what="the controller to be busy")
    assert (await get_claim(client))["metadata"]["finalizers"] == [storage.PVC_PROTECTION_FINALIZER]
    await set_pod_status(client, "train", phase="Succeeded")
    await eventually(lambda: absent(client, CLAIMS, "data"), what="the claim to go")
    await eventually(lambda: _is(phase_of(client, VOLUMES, "used"), "Released"), what="its volume to be released")


async def test_a_bound_volume_outlives_its_deletion_until_released(client: Client, controllers) -> None:
    await controllers(enabled=PV_CONTROLLERS)
    await bound_pair(client, volume("vol"))
    await client.delete(VOLUMES, "vol")
    pv = await get_volume(client, "vol")
    assert pv["metadata"]["deletionTimestamp"] and pv["metadata"]["finalizers"] == [storage.PV_PROTECTION_FINALIZER]
    assert await phase_of(client, CLAIMS, "data") == "Bound"
    await client.delete(CLAIMS, "data", NS)
    await eventually(lambda: absent(client, VOLUMES, "vol"), what="the volume to go once released")


async def test_a_claim_whose_volume_vanished_is_lost(client: Client, controllers) -> None:
    await controllers(enabled=PV_CONTROLLERS)
    await bound_pair(client, volume("vol"))
    pv = await get_volume(client, "vol")
    pv["metadata"]["finalizers"] = []
    await client.update(pv, raw=True)
    await client.delete(VOLUMES, "vol")
    await eventually(lambda: _is(phase_of(client, CLAIMS, "data"), "Lost"), what="the claim to be Lost")
    events = await events_for(client, "data", "ClaimLost")
    assert events[0]["message"] == "Bound claim has lost its PersistentVolume. Data on the volume is lost!"
    assert "capacity" not in (await get_claim(client))["status"]


# -- the local-path provisioner --------------------------------------------------------------


@pytest.fixture
def node_path(tmp_path: Path) -> str:
    return str(tmp_path / "volumes")


async def test_the_default_class_is_made_at_start(client: Client, controllers, node_path: str) -> None:
    await controllers(enabled=STORAGE, local_path_node_path=node_path)
    sc = await client.get(CLASSES, storage.LOCAL_PATH_CLASS, raw=True)
    assert sc["provisioner"] == storage.LOCAL_PATH_PROVISIONER
    assert (sc["reclaimPolicy"], sc["volumeBindingMode"]) == ("Delete", "WaitForFirstConsumer")
    assert sc["parameters"] == {"nodePath": node_path}
    assert sc["metadata"]["annotations"] == {storage.ANN_DEFAULT_CLASS: "true"}
    created = await client.create(claim(), raw=True)
    assert created["spec"]["storageClassName"] == storage.LOCAL_PATH_CLASS


async def test_the_made_class_is_not_the_default_beside_another(client: Client, controllers) -> None:
    await client.create({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                         "metadata": {"name": "nfs", "annotations": {storage.ANN_DEFAULT_CLASS: "true"}},
                         "provisioner": "example.com/nfs"}, raw=True)
    await controllers(enabled=STORAGE)
    sc = await client.get(CLASSES, storage.LOCAL_PATH_CLASS, raw=True)
    assert not storage.is_default_class(sc)


async def test_a_claim_made_before_any_default_class_gets_it_later(client: Client, controllers) -> None:
    created = await client.create(claim(), raw=True)
    assert "storageClassName" not in created["spec"]
    await controllers(enabled=STORAGE)
    await eventually(lambda: _class_of(client), what="the default class to be given")


async def _class_of(client: Client) -> str | None:
    return (await get_claim(client))["spec"].get("storageClassName")


async def test_a_claim_waits_for_its_first_consumer_and_names_it(client: Client, controllers) -> None:
    await controllers(enabled=STORAGE)
    await client.create(claim(), raw=True)
    events = await eventually(lambda: events_for(client, "data", "WaitForFirstConsumer"), what="WaitForFirstConsumer")
    assert events[0]["message"] == "waiting for first consumer to be created before binding"
    await client.create(pod("train", volumes=[{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]), raw=True)
    events = await eventually(lambda: events_for(client, "data", "WaitForPodScheduled"), what="WaitForPodScheduled")
    assert events[0]["message"] == "waiting for pod train to be scheduled"
    assert (await client.list(VOLUMES, raw=True)).items == []


async def test_the_provisioner_makes_a_volume_on_the_selected_node(client: Client, controllers,
                                                                   node_path: str) -> None:
    await controllers(enabled=STORAGE, local_path_node_path=node_path)
    await client.create(node_object("gpu-1"), raw=True)
    pvc = await client.create(claim("ckpt", "20Gi", node="gpu-1", accessModes=["ReadWriteOnce", "ReadOnlyMany"]),
                              raw=True)
    await eventually(lambda: _is(phase_of(client, CLAIMS, "ckpt"), "Bound"), what="the claim to bind")
    uid = pvc["metadata"]["uid"]
    pv = await get_volume(client, f"pvc-{uid}")
    assert pv["spec"]["hostPath"] == {"path": f"{node_path}/pvc-{uid}_{NS}_ckpt", "type": "DirectoryOrCreate"}
    assert pv["spec"]["nodeAffinity"] == {"required": {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": ["gpu-1"]}]}]}}
    assert pv["spec"]["capacity"] == {"storage": "20Gi"}
    assert pv["spec"]["accessModes"] == ["ReadWriteOnce", "ReadOnlyMany"]
    assert (pv["spec"]["persistentVolumeReclaimPolicy"], pv["spec"]["storageClassName"]) == ("Delete", "local-path")
    assert pv["spec"]["claimRef"]["uid"] == uid
    assert pv["metadata"]["annotations"] == {storage.ANN_PROVISIONED_BY: storage.LOCAL_PATH_PROVISIONER}
    assert pv["metadata"]["labels"] == {storage.LOCAL_PATH_NODE_LABEL: "gpu-1"}
    assert set(pv["metadata"]["finalizers"]) == {storage.LOCAL_PATH_CLEANUP_FINALIZER, storage.PV_PROTECTION_FINALIZER}
    assert sorted(await reasons(client, "ckpt")) == ["ExternalProvisioning", "Provisioning", "ProvisioningSucceeded"]
    bound = await get_claim(client, "ckpt")
    assert bound["spec"]["volumeName"] == f"pvc-{uid}"
    assert bound["status"]["capacity"] == {"storage": "20Gi"}
    # Released with reclaim policy Delete: the volume is deleted, and waits for its node.
    await client.delete(CLAIMS, "ckpt", NS)
    await eventually(lambda: _finalizers_left(client, f"pvc-{uid}", [storage.LOCAL_PATH_CLEANUP_FINALIZER]),
                     what="the volume to wait for its node's cleanup")


async def _finalizers_left(client: Client, name: str, wanted: list[str]) -> bool:
    pv = await get_volume(client, name)
    return bool(pv["metadata"].get("deletionTimestamp")) and pv["metadata"].get("finalizers") == wanted


async def test_a_claim_for_a_node_that_does_not_exist_is_given_back(client: Client, controllers) -> None:
    await controllers(enabled=STORAGE)
    await client.create(claim(node="ghost"), raw=True)
    events = await eventually(lambda: events_for(client, "data", "ProvisioningFailed"), what="ProvisioningFailed")
    assert events[0]["message"] == 'failed to provision volume with StorageClass "local-path": node "ghost" not found'
    await eventually(lambda: _selected_node_gone(client), what="the node to be given back")
    assert (await client.list(VOLUMES, raw=True)).items == []


async def _selected_node_gone(client: Client) -> bool:
    return storage.ANN_SELECTED_NODE not in ((await get_claim(client))["metadata"].get("annotations") or {})


async def test_a_rancher_class_is_served_too(client: Client, controllers) -> None:
    await controllers(enabled=STORAGE)
    await client.create(node_object("gpu-1"), raw=True)
    await client.create({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": "rancher"},
                         "provisioner": storage.RANCHER_LOCAL_PATH_PROVISIONER,
                         "volumeBindingMode": "WaitForFirstConsumer"}, raw=True)
    await client.create(claim(storageClassName="rancher", node="gpu-1"), raw=True)
    await eventually(lambda: _is(phase_of(client, CLAIMS, "data"), "Bound"), what="the claim to bind")
    pv = await get_volume(client, (await get_claim(client))["spec"]["volumeName"])
    assert pv["metadata"]["annotations"][storage.ANN_PROVISIONED_BY] == storage.RANCHER_LOCAL_PATH_PROVISIONER
    assert pv["spec"]["hostPath"]["path"].startswith(storage.DEFAULT_NODE_PATH + "/pvc-")


async def test_a_bound_local_claim_grows_when_its_class_allows(client: Client, controllers) -> None:
    await controllers(enabled=STORAGE)
    await client.create(node_object("gpu-1"), raw=True)
    await client.create(claim(node="gpu-1"), raw=True)
    await eventually(lambda: _is(phase_of(client, CLAIMS, "data"), "Bound"), what="the claim to bind")
    pvc = await get_claim(client)
    pvc["spec"]["resources"]["requests"]["storage"] = "3Gi"
    await client.update(pvc, raw=True)
    await eventually(lambda: _capacity(client), what="the claim's capacity to grow")
    assert (await get_volume(client, pvc["spec"]["volumeName"]))["spec"]["capacity"] == {"storage": "3Gi"}
    assert "VolumeResizeSuccessful" in await reasons(client, "data")


async def _capacity(client: Client) -> bool:
    return ((await get_claim(client)).get("status") or {}).get("capacity") == {"storage": "3Gi"}


async def test_only_classes_that_allow_it_let_a_claim_grow(client: Client, controllers) -> None:
    await controllers(enabled=PV_CONTROLLERS)
    await bound_pair(client, volume("fixed", "5Gi"))
    await eventually(lambda: _is(phase_of(client, CLAIMS, "data"), "Bound"), what="the claim to bind")
    pvc = await get_claim(client)
    pvc["spec"]["resources"]["requests"]["storage"] = "10Gi"
    with pytest.raises(Forbidden) as err:
        await client.update(pvc, raw=True)
    assert err.value.message == ('persistentvolumeclaims "data" is forbidden: only dynamically provisioned pvc can be '
                                 'resized and the storageclass that provisions the pvc must support resize')
