"""The local-path provisioner as plain decisions: the claim, its class, its volume and whether
its node exists in; the volume to make, the Events and the writes out."""

from __future__ import annotations

from typing import Any

from gpufleet.api import storage
from gpufleet.controllers.localpath import (
    THEN,
    VOLUME,
    decide_claim,
    decide_expand,
    decide_volume,
    default_class,
)

UID = "1111-2222"


def claim(*, node: str | None = "gpu-1", handed: str | None = storage.LOCAL_PATH_PROVISIONER, size: str = "1Gi",
          volume_name: str | None = None, capacity: str | None = None, **spec: Any) -> dict[str, Any]:
    annotations: dict[str, str] = {}
    if node:
        annotations[storage.ANN_SELECTED_NODE] = node
    if handed:
        annotations[storage.ANN_STORAGE_PROVISIONER] = handed
    body: dict[str, Any] = {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data", "namespace": "team", "uid": UID, "resourceVersion": "5",
                     "annotations": annotations},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": storage.LOCAL_PATH_CLASS,
                 "resources": {"requests": {"storage": size}}, **spec},
        "status": {},
    }
    if volume_name:
        body["spec"]["volumeName"] = volume_name
    if capacity:
        body["status"] = {"phase": "Bound", "capacity": {"storage": capacity}}
    return body


def local_class(**changes: Any) -> dict[str, Any]:
    return {**default_class("/srv/lp"), **changes}


def made_volume(size: str = "1Gi", **status: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": f"pvc-{UID}", "uid": "pv-uid",
                         "annotations": {storage.ANN_PROVISIONED_BY: storage.LOCAL_PATH_PROVISIONER}},
            "spec": {"capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"],
                     "persistentVolumeReclaimPolicy": "Delete",
                     "claimRef": {"kind": "PersistentVolumeClaim", "namespace": "team", "name": "data", "uid": UID}},
            "status": status}


def events(actions) -> list[tuple[str, str]]:
    return [(e.type, e.reason) for e in actions.events]


def test_a_handed_claim_gets_a_volume_on_its_node_with_events_around_the_create():
    actions = decide_claim(claim(), local_class(), None, node_exists=True)
    assert actions.reason == "Provision"
    [create] = actions.creates
    assert create.on_exists == "ignore" and create.tag == VOLUME
    body = create.body
    assert body["metadata"]["name"] == f"pvc-{UID}"
    assert body["spec"]["hostPath"] == {"path": f"/srv/lp/pvc-{UID}_team_data", "type": "DirectoryOrCreate"}
    assert body["metadata"]["labels"] == {storage.LOCAL_PATH_NODE_LABEL: "gpu-1"}
    assert body["spec"]["claimRef"]["uid"] == UID
    assert events(actions) == [("Normal", "Provisioning")]
    assert [(e.reason, e.message) for e in actions.memo[THEN]] == [
        ("ProvisioningSucceeded", f"Successfully provisioned volume pvc-{UID}")]


def test_claims_not_for_this_provisioner_or_not_ready_are_left_alone():
    sc = local_class()
    assert decide_claim(claim(), None, None, node_exists=True).reason == "NotOurs"
    other = local_class(provisioner="example.com/nfs")
    assert decide_claim(claim(), other, None, node_exists=True).reason == "NotOurs"
    assert decide_claim(claim(handed=None), sc, None, node_exists=True).reason == "NotHanded"
    assert decide_claim(claim(node=None), sc, None, node_exists=False).reason == "NoNode"
    assert decide_claim(claim(), sc, made_volume(), node_exists=True).reason == "Provisioned"
    deleting = claim()
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert decide_claim(deleting, sc, None, node_exists=True).reason == "Deleting"
    assert decide_claim(claim(handed=None), sc, None, node_exists=True).empty
    assert decide_claim(claim(node=None), sc, None, node_exists=False).empty


def test_what_cannot_be_provisioned_says_why():
    immediate = local_class(volumeBindingMode="Immediate")
    cases = [
        (decide_claim(claim(), immediate, None, node_exists=True), "needs volumeBindingMode WaitForFirstConsumer"),
        (decide_claim(claim(selector={"matchLabels": {"a": "b"}}), local_class(), None, node_exists=True),
         "claim Selector is not supported"),
        (decide_claim(claim(volumeMode="Block"), local_class(), None, node_exists=True),
         "support only volumeMode Filesystem"),
    ]
    for actions, why in cases:
        assert actions.creates == [] and actions.updates == []
        [event] = actions.events
        assert (event.type, event.reason) == ("Warning", "ProvisioningFailed")
        assert event.message.startswith('failed to provision volume with StorageClass "local-path": ')
        assert why in event.message


def test_a_node_that_does_not_exist_is_given_back_to_the_scheduler():
    pvc = claim(node="gone")
    actions = decide_claim(pvc, local_class(), None, node_exists=False)
    assert actions.reason == "GiveBackNode" and actions.creates == []
    assert 'node "gone" not found' in actions.events[0].message
    [update] = actions.updates
    assert storage.ANN_SELECTED_NODE not in update.body["metadata"]["annotations"]
    assert update.body["metadata"]["annotations"][storage.ANN_STORAGE_PROVISIONER] == storage.LOCAL_PATH_PROVISIONER
    assert storage.ANN_SELECTED_NODE in pvc["metadata"]["annotations"]  # the input is not touched


def test_a_bound_claim_grows_its_volume_then_its_status():
    pvc = claim(volume_name=f"pvc-{UID}", size="3Gi", capacity="1Gi")
    actions = decide_claim(pvc, local_class(), made_volume("1Gi"), node_exists=True)
    assert actions.reason == "Expand"
    [update] = actions.updates
    assert update.body["spec"]["capacity"] == {"storage": "3Gi"}
    assert actions.status == {"phase": "Bound", "capacity": {"storage": "3Gi"}}
    assert [e.reason for e in actions.memo[THEN]] == ["VolumeResizeSuccessful"]
    # The volume grew already; only the claim's status is behind.
    status_only = decide_expand(pvc, local_class(), made_volume("3Gi"))
    assert status_only.updates == [] and status_only.status == {"phase": "Bound", "capacity": {"storage": "3Gi"}}
    done = decide_expand(claim(volume_name=f"pvc-{UID}", size="3Gi", capacity="3Gi"), local_class(), made_volume("3Gi"))
    assert done.empty and done.reason == "Expanded"


def test_growth_needs_a_class_that_allows_it_and_a_volume_of_ours_bound_to_the_claim():
    pvc = claim(volume_name=f"pvc-{UID}", size="3Gi", capacity="1Gi")
    assert decide_expand(pvc, local_class(allowVolumeExpansion=False), made_volume()).empty
    assert decide_expand(pvc, local_class(), None).reason == "NotOurVolume"
    foreign = made_volume()
    foreign["metadata"]["annotations"] = {}
    assert decide_expand(pvc, local_class(), foreign).reason == "NotOurVolume"
    elsewhere = made_volume()
    elsewhere["spec"]["claimRef"]["uid"] = "another"
    assert decide_expand(pvc, local_class(), elsewhere).empty


def test_a_released_volume_of_ours_with_policy_delete_is_deleted_on_its_uid():
    actions = decide_volume(made_volume(phase="Released"))
    [delete] = actions.deletes
    assert (delete.kind, delete.name, delete.namespace, delete.uid) == ("persistentvolumes", f"pvc-{UID}", None,
                                                                        "pv-uid")
    assert decide_volume(made_volume(phase="Bound")).empty
    retained = made_volume(phase="Released")
    retained["spec"]["persistentVolumeReclaimPolicy"] = "Retain"
    assert decide_volume(retained).empty
    deleting = made_volume(phase="Released")
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert decide_volume(deleting).empty
    foreign = made_volume(phase="Released")
    foreign["metadata"]["annotations"] = {}
    assert decide_volume(foreign).empty
