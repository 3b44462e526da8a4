"""The PodGroup kind (scheduling.x-k8s.io/v1alpha1): served, validated, printed."""

from __future__ import annotations

import pytest
from test_scheduler_integration import control_plane  # noqa: F401  (fixture)

from gpufleet.api.registry import REGISTRY
from gpufleet.apiserver.tables import printer_for
from gpufleet.client.errors import ApiError

NS = "default"


def pod_group(name: str, **spec) -> dict:
    return {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": NS},
        "spec": spec,
    }


def test_the_kind_is_registered_like_upstream():
    rt = REGISTRY.resolve("pg")
    assert rt is not None
    assert (rt.group, rt.version, rt.kind, rt.plural, rt.namespaced) == (
        "scheduling.x-k8s.io",
        "v1alpha1",
        "PodGroup",
        "podgroups",
        True,
    )
    assert "status" in rt.subresources


def test_printer_columns():
    printer = printer_for(REGISTRY.resolve("podgroups"))
    assert [c.name for c in printer.columns] == ["Name", "Phase", "MinMember", "Scheduled", "Running", "Age"]
    obj = {
        "metadata": {"name": "job-a", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"minMember": 4},
        "status": {"phase": "Running", "scheduled": 4, "running": 3},
    }
    cells = printer.row(obj, 1767225600.0 + 90)
    assert cells == ["job-a", "Running", 4, 4, 3, "90s"]


async def test_validation_reports_every_problem_with_its_field(control_plane):  # noqa: F811
    client = control_plane.client
    with pytest.raises(ApiError) as info:
        await client.create(
            pod_group("bad", minMember=0, scheduleTimeoutSeconds=-1, minResources={"cpu": "lots"})
        )
    message = info.value.message
    assert 'PodGroup.scheduling.x-k8s.io "bad" is invalid' in message
    assert "spec.minMember: Invalid value: 0: must be greater than or equal to 1" in message
    assert "spec.scheduleTimeoutSeconds: Invalid value: -1" in message
    assert "spec.minResources[cpu]: Invalid value" in message
    with pytest.raises(ApiError) as info:
        await client.create(pod_group("missing"))
    assert "spec.minMember: Required value" in info.value.message

    created = await client.create(pod_group("ok", minMember=2, minResources={"nvidia.com/gpu": 16}))
    assert created.spec.min_member == 2
    status = {"phase": "Scheduled", "scheduled": 2}
    updated = await client.patch(
        "podgroups.scheduling.x-k8s.io", "ok", {"status": status}, NS, subresource="status"
    )
    assert (updated.status.phase, updated.status.scheduled) == ("Scheduled", 2)
