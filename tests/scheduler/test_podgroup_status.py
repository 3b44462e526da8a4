"""The status the scheduler writes on a PodGroup: its phase through the life of the gang,
including its end when members are deleted as they finish, and what `describe` says of
``status.occupiedBy``."""

from __future__ import annotations

import pytest

from gpufleet.api import k8s
from gpufleet.cli.commands.describe import _gang_status
from gpufleet.cli.describe_text import Doc
from gpufleet.scheduler.scheduler import _occupied_by, podgroup_phase


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
    assert _occupied_by(pod) == "default/holder,default/mlp"
    assert _occupied_by(k8s.Pod.from_dict({"metadata": {"name": "bare", "namespace": "default"}})) == ""


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
