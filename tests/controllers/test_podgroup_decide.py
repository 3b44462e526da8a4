"""A PodGroup's status write as a plain decision: the group and its members in; a merge patch
of its status subresource out, or nothing when it holds that status."""

from __future__ import annotations

from gpufleet.api import k8s
from gpufleet.api import podgroup as pg_api
from gpufleet.controllers.podgroup import decide_podgroup


def group(status: dict | None = None) -> pg_api.PodGroup:
    body = {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
            "metadata": {"name": "gang", "namespace": "team"}, "spec": {"minMember": 2}}
    if status is not None:
        body["status"] = status
    return pg_api.PodGroup.model_validate(body)


def member(name: str, phase: str) -> k8s.Pod:
    return k8s.Pod.model_validate({
        "metadata": {"name": name, "namespace": "team", "labels": {pg_api.POD_GROUP_LABEL: "gang"}},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]},
        "status": {"phase": phase}})


def test_a_changed_status_is_a_merge_patch_of_the_status_subresource():
    actions = decide_podgroup("team/gang", group(), [member("a", "Running"), member("b", "Running")])
    (patch,) = actions.patches
    assert (patch.kind, patch.name, patch.namespace, patch.subresource) == (pg_api.PodGroup, "gang", "team", "status")
    assert patch.patch == {"status": {"phase": "Running", "scheduled": 2, "running": 2, "succeeded": 0,
                                      "failed": 0}}
    assert actions.reason == "Running" and actions.status is None


def test_a_held_status_is_not_written_again():
    held = group({"phase": "Running", "scheduled": 2, "running": 2, "scheduleStartTime": "2026-01-01T00:00:00Z"})
    assert decide_podgroup("team/gang", held, [member("a", "Running"), member("b", "Running")]).empty
