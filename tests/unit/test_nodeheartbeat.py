"""heartbeat_only: a Node update that only moves heartbeat times, against every other change."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpufleet.api.k8s import Node
from gpufleet.api.nodeheartbeat import heartbeat_only


def node(**changes: Any) -> Node:
    body: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "n1", "resourceVersion": "5", "labels": {"zone": "a"},
                     "managedFields": [{"manager": "agent", "operation": "Update", "apiVersion": "v1",
                                        "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1",
                                        "fieldsV1": {"f:status": {}}}]},
        "spec": {"podCIDR": "10.0.0.0/24"},
        "status": {"allocatable": {"nvidia.com/gpu": "8"},
                   "addresses": [{"type": "InternalIP", "address": "10.1.0.1"}],
                   "conditions": [{"type": t, "status": s, "reason": t, "message": t,
                                   "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                                   "lastTransitionTime": "2026-01-01T00:00:00Z"}
                                  for t, s in (("MemoryPressure", "False"), ("Ready", "True"))]},
    }
    for path, value in changes.items():
        *parents, last = path.split("__")
        target = body
        for p in parents:
            target = target[int(p)] if isinstance(target, list) else target[p]
        if isinstance(target, list):
            target[int(last)] = value
        else:
            target[last] = value
    return Node.model_validate(copy.deepcopy(body))


def test_a_heartbeat_is_heartbeat_only() -> None:
    beat = node(status__conditions__0__lastHeartbeatTime="2026-01-01T00:00:30Z",
                status__conditions__1__lastHeartbeatTime="2026-01-01T00:00:30Z",
                metadata__resourceVersion="9",
                metadata__managedFields=[])
    assert heartbeat_only(node(), beat)
    assert heartbeat_only(node(), node())


@pytest.mark.parametrize("change", [
    {"status__conditions__1__status": "False"},
    {"status__conditions__1__reason": "KubeletNotReady"},
    {"status__conditions__1__lastTransitionTime": "2026-01-01T00:00:30Z"},
    {"status__allocatable": {"nvidia.com/gpu": "7"}},
    {"status__addresses": [{"type": "InternalIP", "address": "10.1.0.2"}]},
    {"metadata__labels": {"zone": "b"}},
    {"metadata__annotations": {"a": "b"}},
    {"spec__unschedulable": True},
    {"spec__taints": [{"key": "k", "effect": "NoSchedule"}]},
])
def test_anything_else_is_a_change(change: dict[str, Any]) -> None:
    assert not heartbeat_only(node(), node(**change))
    assert not heartbeat_only(node(**change), node())


def test_a_condition_added_or_removed_is_a_change() -> None:
    one = node()
    assert one.status is not None and one.status.conditions
    fewer = one.model_copy(deep=True)
    assert fewer.status is not None and fewer.status.conditions
    fewer.status.conditions = fewer.status.conditions[:1]
    assert not heartbeat_only(one, fewer)
    assert not heartbeat_only(None, one)
