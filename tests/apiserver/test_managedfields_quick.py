"""The cheap path of record_update (managedfields/quick.py): a write that changes only values
its manager already owns alone — a Lease renewal, a node's heartbeat — keeps the entries and
moves that manager's time, exactly as the general path does; anything else goes the general
way."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.apiserver.managedfields import operations, quick, record_update

T0, T1, T2 = "2026-01-01T00:00:00Z", "2026-01-01T00:00:10Z", "2026-01-01T00:00:20Z"
LEASES = "coordination.k8s.io/v1"


@pytest.fixture
def taken(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Records, per record_update, whether the cheap path answered."""
    calls: list[bool] = []
    real = quick.unchanged_ownership

    def spy(*args: Any, **kwargs: Any) -> Any:
        out = real(*args, **kwargs)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(operations, "unchanged_ownership", spy)
    return calls


def general(old: dict[str, Any] | None, new: dict[str, Any], **kw: Any) -> dict[str, Any]:
    """record_update the general way only."""
    real = operations.unchanged_ownership
    operations.unchanged_ownership = lambda *a, **k: None
    try:
        return record_update(old, new, **kw)
    finally:
        operations.unchanged_ownership = real


def lease(renew: str) -> dict[str, Any]:
    return {"apiVersion": LEASES, "kind": "Lease",
            "metadata": {"name": "n1", "namespace": "kube-node-lease", "uid": "u1", "resourceVersion": "1"},
            "spec": {"holderIdentity": "n1", "leaseDurationSeconds": 40, "renewTime": renew}}


def node(heartbeat: str, gpus: str = "8") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "uid": "u2", "labels": {"zone": "a"}},
            "spec": {},
            "status": {"allocatable": {"nvidia.com/gpu": gpus, "cpu": "64"},
                       "conditions": [{"type": t, "status": s, "reason": t, "lastHeartbeatTime": heartbeat,
                                       "lastTransitionTime": T0}
                                      for t, s in (("MemoryPressure", "False"), ("Ready", "True"))]}}


def with_managed(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """What a merge patch or a PUT of the fetched object sends: the live managedFields."""
    out = copy.deepcopy(new)
    out["metadata"]["managedFields"] = copy.deepcopy(old["metadata"]["managedFields"])
    return out


def times(obj: dict[str, Any]) -> dict[str, str]:
    return {f"{e['manager']}/{e.get('subresource', '')}": e["time"] for e in obj["metadata"]["managedFields"]}


def test_a_lease_renewal_keeps_ownership_and_moves_the_renewers_time(taken: list[bool]) -> None:
    kw = {"manager": "gpufleet-agent", "kind": "Lease", "api_version": LEASES}
    created = record_update(None, lease("2026-01-01T00:00:00.000000Z"), now=T0, **kw)
    renewed = with_managed(created, lease("2026-01-01T00:00:02.000000Z"))
    taken.clear()
    out = record_update(created, renewed, now=T1, **kw)
    assert taken == [True]
    assert out == general(created, renewed, now=T1, **kw)
    assert times(out) == {"gpufleet-agent/": T1}
    assert out["metadata"]["managedFields"][0]["fieldsV1"] == created["metadata"]["managedFields"][0]["fieldsV1"]
    # The same renewal sent without managedFields (a client unaware of them) starts from the stored ones.
    bare = lease("2026-01-01T00:00:02.000000Z")
    assert record_update(created, bare, now=T1, **kw) == out


def test_a_node_heartbeat_through_status_moves_only_the_agents_status_entry(taken: list[bool]) -> None:
    kw = {"kind": "Node", "api_version": "v1"}
    created = record_update(None, node(T0), manager="gpufleet-agent", now=T0, **kw)
    labelled = copy.deepcopy(created)
    labelled["metadata"]["labels"]["team"] = "a"
    labelled = record_update(created, labelled, manager="kubectl-label", now=T0, **kw)
    status = record_update(labelled, with_managed(labelled, {**node(T1), "metadata": labelled["metadata"]}),
                           manager="gpufleet-agent", now=T1, subresource="status", **kw)
    beat = {**node(T2), "metadata": copy.deepcopy(status["metadata"])}
    taken.clear()
    out = record_update(status, beat, manager="gpufleet-agent", now=T2, subresource="status", **kw)
    assert taken == [True]
    assert out == general(status, beat, manager="gpufleet-agent", now=T2, subresource="status", **kw)
    assert times(out) == {"gpufleet-agent/": T0, "kubectl-label/": T0, "gpufleet-agent/status": T2}
    # kube-apiserver's order: by time, so the entry that just moved comes last.
    assert [e["manager"] for e in out["metadata"]["managedFields"]][-1] == "gpufleet-agent"


def test_a_write_that_changes_nothing_keeps_every_time(taken: list[bool]) -> None:
    kw = {"manager": "gpufleet-agent", "kind": "Lease", "api_version": LEASES}
    created = record_update(None, lease("2026-01-01T00:00:00.000000Z"), now=T0, **kw)
    same = with_managed(created, lease("2026-01-01T00:00:00.000000Z"))
    taken.clear()
    out = record_update(created, same, now=T1, **kw)
    assert taken == [True]
    assert out == general(created, same, now=T1, **kw)
    assert times(out) == {"gpufleet-agent/": T0}


@pytest.mark.parametrize("change", ["other-owner", "new-field", "removed-field", "client-entries"])
def test_writes_that_move_fields_go_the_general_way(taken: list[bool], change: str) -> None:
    kw = {"kind": "Node", "api_version": "v1"}
    created = record_update(None, node(T0), manager="gpufleet-agent", now=T0, **kw)
    new = with_managed(created, node(T0))
    manager = "gpufleet-agent"
    if change == "other-owner":
        manager = "ops"  # takes allocatable from the agent
        new["status"]["allocatable"]["nvidia.com/gpu"] = "7"
    elif change == "new-field":
        new["metadata"]["labels"]["team"] = "a"
    elif change == "removed-field":
        del new["metadata"]["labels"]["zone"]
    else:
        new["metadata"]["managedFields"][0]["manager"] = "someone-else"
        new["status"]["conditions"][0]["lastHeartbeatTime"] = T1
    taken.clear()
    out = record_update(created, new, manager=manager, now=T1, **kw)
    assert True not in taken
    assert out == general(created, new, manager=manager, now=T1, **kw)
    if change == "other-owner":
        assert times(out) == {"gpufleet-agent/": T0, "ops/": T1}


_KEYS = st.sampled_from(["a", "b", "c"])
_STEP = st.tuples(st.sampled_from(["alice", "bob"]), st.sampled_from(["", "status"]),
                  st.dictionaries(_KEYS, st.sampled_from(["1", "2"]), max_size=3),
                  st.dictionaries(_KEYS, st.sampled_from(["1", "2"]), max_size=3))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(_STEP, min_size=1, max_size=6))
def test_the_cheap_path_agrees_with_the_general_one(steps: list[tuple[str, str, dict, dict]]) -> None:
    """Any sequence of writes by two managers through the resource and its status."""
    kw = {"kind": "Node", "api_version": "v1"}
    live = record_update(None, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n", "labels": {"a": "1"}},
                                "status": {"capacity": {"a": "1"}}}, manager="alice", now=T0, **kw)
    for i, (manager, sub, labels, capacity) in enumerate(steps):
        new = copy.deepcopy(live)
        if sub:
            new["status"] = {"capacity": capacity}
        else:
            new["metadata"]["labels"] = labels
        now = f"2026-01-01T00:01:{i:02d}Z"
        out = record_update(live, new, manager=manager, now=now, subresource=sub, ignore_status=True, **kw)
        assert out == general(live, new, manager=manager, now=now, subresource=sub, ignore_status=True, **kw)
        live = out
