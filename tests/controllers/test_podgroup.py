"""The status the PodGroup controller writes on a PodGroup: its phase through the life of the gang,
including its end when members are deleted as they finish, and what `describe` says of
``status.occupiedBy``."""

from __future__ import annotations

import pytest

from gpufleet.api import k8s
from gpufleet.api import podgroup as pg_api
from gpufleet.cli.commands.describe import _gang_status
from gpufleet.cli.describe_text import Doc
from gpufleet.controllers.podgroup import decide, occupied_by, podgroup_phase, podgroup_status


@pytest.mark.parametrize(("counts", "previous", "phase"), [
    # (members, scheduled, running, succeeded, failed) of a group with minMember 3
    ((2, 0, 0, 0, 0), None, "Pending"),
    ((3, 0, 0, 0, 0), "Pending", "PreScheduling"),
    ((3, 1, 0, 0, 0), "PreScheduling", "Scheduling"),
    ((3, 3, 0, 0, 0), "Scheduling", "Scheduled"),
    ((3, 3, 3, 0, 0), "Scheduled", "Running"),
    ((3, 3, 1, 2, 0), "Running", "Running"),
    ((3, 3, 0, 3, 0), "Running", "Finished"),
    ((3, 3, 2, 0, 1), "Running", "Failed"),
    # The master succeeded and the operator deleted the workers: the gang has ended.
    ((1, 1, 0, 1, 0), "Running", "Finished"),
    # A worker failed and the rest were stopped and deleted.
    ((1, 1, 0, 0, 1), "Running", "Failed"),
    # Every pod deleted once the gang ended: the group stays ended ...
    ((0, 0, 0, 0, 0), "Finished", "Finished"),
    ((0, 0, 0, 0, 0), "Failed", "Failed"),
    # ... until a new attempt of the same gang brings members that are not done.
    ((3, 0, 0, 0, 0), "Failed", "PreScheduling"),
    ((0, 0, 0, 0, 0), "Running", "Pending"),
])
def test_phase_through_the_life_of_a_gang(counts: tuple[int, ...], previous: str | None, phase: str) -> None:
    members, scheduled, running, succeeded, failed = counts
    assert podgroup_phase(3, members, scheduled, running, succeeded, failed, previous) == phase


def test_occupied_by_names_the_owners_as_scheduler_plugins_does() -> None:
    pod = k8s.Pod.from_dict({"metadata": {"name": "mlp-worker-0", "namespace": "default", "ownerReferences": [
        {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "mlp", "uid": "u1", "controller": True},
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "holder", "uid": "u2"},
    ]}})
    assert occupied_by(pod) == "default/holder,default/mlp"
    assert occupied_by(k8s.Pod.from_dict({"metadata": {"name": "bare", "namespace": "default"}})) == ""


@pytest.mark.parametrize(("phase", "shown"), [
    ("Running", True), ("PreScheduling", True), ("Finished", False), ("Failed", False)])
def test_describe_says_occupied_by_only_while_the_group_is_in_use(phase: str, shown: bool) -> None:
    doc = Doc()
    group = {"spec": {"minMember": 2},
             "status": {"phase": phase, "occupiedBy": "default/mlp", "succeeded": 2}}
    _gang_status(doc, 0, group, [])
    text = doc.render()
    assert "Phase:" in text and phase in text
    assert ("Occupied By:" in text and "default/mlp" in text) is shown


def _group(min_member: int, status: dict | None = None) -> pg_api.PodGroup:
    return pg_api.PodGroup.model_validate({
        "apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
        "metadata": {"name": "mlp", "namespace": "default"},
        "spec": {"minMember": min_member}, **({"status": status} if status is not None else {})})


def _member(name: str, node: str | None = None, phase: str = "Pending", owner: str | None = None) -> k8s.Pod:
    meta: dict = {"name": name, "namespace": "default", "labels": {pg_api.POD_GROUP_LABEL: "mlp"}}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": owner,
                                    "uid": "u1", "controller": True}]
    return k8s.Pod.from_dict({"metadata": meta, "spec": {"containers": [{"name": "c", "image": "x"}],
                                                          **({"nodeName": node} if node else {})},
                              "status": {"phase": phase}})


def test_the_status_counts_the_members_bound_running_and_ended() -> None:
    members = [_member("w-0", "n1", "Running", owner="mlp"), _member("w-1", "n2", "Succeeded"),
               _member("w-2", None)]
    assert podgroup_status(_group(3), members) == {
        "phase": "Scheduling", "scheduled": 2, "running": 1, "succeeded": 1, "failed": 0,
        "occupiedBy": "default/mlp"}
    assert podgroup_status(_group(2), members)["phase"] == "Running"


def test_an_ended_gang_keeps_its_counts_when_its_pods_are_deleted() -> None:
    ended = _group(2, {"phase": "Finished", "scheduled": 2, "succeeded": 2})
    assert podgroup_status(ended, []) == {
        "phase": "Finished", "scheduled": 2, "running": 0, "succeeded": 2, "failed": 0}


def test_decide_writes_only_what_changed_and_leaves_the_schedule_start_time_alone() -> None:
    members = [_member("w-0"), _member("w-1")]
    assert decide(_group(2), members) == {
        "phase": "PreScheduling", "scheduled": 0, "running": 0, "succeeded": 0, "failed": 0}
    # Counts the status leaves out are zero; scheduleStartTime is the scheduler's.
    current = _group(2, {"phase": "PreScheduling", "scheduleStartTime": "2024-05-01T10:00:00Z"})
    assert decide(current, members) is None
    assert "scheduleStartTime" not in (decide(current, [_member("w-0", "n1"), _member("w-1")]) or {})
