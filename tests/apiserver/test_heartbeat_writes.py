"""Heartbeat writes (apiserver/heartbeat.py): an update that moves only a Lease's renewTime or a
Node's condition heartbeat times skips decoding the unchanged rest, and answers exactly what
the general path answers: the same status, the same object stored (times in the models'
form), the same errors for a bad time. Each case is written twice, to two like objects, once
with the cheap path and once without, and the two answers are compared."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
from apiserver_helpers import Api
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.apiserver import heartbeat

LEASES = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
T0 = "2026-12-07T10:00:00.000000Z"


@pytest.fixture
def taken(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """Counts the updates the cheap path took; ``state["off"] = True`` turns it off."""
    state: dict[str, Any] = {"off": False, "taken": 0}
    real = heartbeat.heartbeat_only

    def spy(*args: Any, **kwargs: Any) -> bool:
        if state["off"]:
            return False
        out = real(*args, **kwargs)
        state["taken"] += out
        return out

    monkeypatch.setattr(heartbeat, "heartbeat_only", spy)
    yield state


def _lease(name: str) -> dict[str, Any]:
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name, "namespace": "kube-node-lease", "labels": {"a": "b"}},
            "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": T0}}


def _node(name: str) -> dict[str, Any]:
    conditions = [{"type": t, "status": s, "reason": t, "message": t.lower(), "lastHeartbeatTime": "2026-12-07T10:00:00Z",
                   "lastTransitionTime": "2026-12-07T09:00:00Z"}
                  for t, s in (("MemoryPressure", "False"), ("DiskPressure", "False"), ("Ready", "True"))]
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"zone": "a"}},
            "spec": {"podCIDR": "10.0.0.0/24"},
            "status": {"capacity": {"cpu": "64", "nvidia.com/gpu": "8"},
                       "allocatable": {"cpu": "64", "nvidia.com/gpu": "8"},
                       "conditions": conditions}}


def _normal(body: Any) -> Any:
    """An answer with what differs between two like objects taken out: names, uids,
    resourceVersions, creation and managed-fields times."""
    body = copy.deepcopy(body)
    if isinstance(body, dict):
        meta = body.get("metadata")
        if isinstance(meta, dict):
            for key in ("name", "uid", "resourceVersion", "creationTimestamp"):
                meta.pop(key, None)
            for entry in meta.get("managedFields") or []:
                entry.pop("time", None)
        spec = body.get("spec")
        if isinstance(spec, dict) and body.get("kind") == "Lease":
            spec.pop("holderIdentity", None)
        details = body.get("details")
        if isinstance(details, dict):
            details.pop("name", None)
        if isinstance(body.get("message"), str):
            body["message"] = body["message"].replace('"fast"', '"X"').replace('"slow"', '"X"')
            body["message"] = body["message"].replace("fast", "X").replace("slow", "X")
    return body


async def _both(api: Api, taken: dict[str, Any], method: str, path: str, make: Any, **kw: Any) -> tuple[Any, Any]:
    """The same write to the fast and the slow object; their answers and what each stored."""
    answers = []
    for name in ("fast", "slow"):
        taken["off"] = name == "slow"
        try:
            r = await api.call(method, path.format(name=name), make(name), **kw)
        finally:
            taken["off"] = False
        stored = await api.must_get(path.format(name=name).removesuffix("/status"))
        answers.append((r.status, _normal(r.json), _normal(stored)))
    return answers[0], answers[1]


async def _leases(api: Api) -> None:
    for name in ("fast", "slow"):
        await api.create(LEASES, _lease(name))


def _renew(value: Any, **spec: Any) -> Any:
    return lambda name: {"spec": {"renewTime": value, **spec}}


LEASE_CASES = [
    ("micro", _renew("2026-12-07T10:00:01.123456Z"), True),
    ("whole seconds", _renew("2026-12-07T10:00:02Z"), True),
    ("an offset and a short fraction", _renew("2026-12-07T12:00:03.5+02:00"), True),
    ("not a time", _renew("yesterday"), False),
    ("a number", _renew(1765101604), False),
    ("and a float duration", _renew("2026-12-07T10:00:05Z", leaseDurationSeconds=40.0), False),
    ("and a zero duration", _renew("2026-12-07T10:00:06Z", leaseDurationSeconds=0), False),
    ("and a bool transitions", _renew("2026-12-07T10:00:07Z", leaseTransitions=True), False),
    ("and another holder", _renew("2026-12-07T10:00:08Z", holderIdentity="other"), False),
    ("and an unknown field", _renew("2026-12-07T10:00:09Z", bogus=1), False),
    ("removed", _renew(None), False),
    ("the same", _renew("2026-12-07T10:00:00Z"), False),  # as stored: no change at all
    ("the same time written another way", _renew(T0), True),
    ("and a label", lambda name: {"metadata": {"labels": {"c": "d"}}, "spec": {"renewTime": "2026-12-07T10:00:10Z"}},
     False),
    ("and managedFields", lambda name: {"metadata": {"managedFields": [{}]},
                                        "spec": {"renewTime": "2026-12-07T10:00:11Z"}}, False),
]


@pytest.mark.parametrize("case,body,cheap", LEASE_CASES, ids=[c[0] for c in LEASE_CASES])
async def test_lease_renewal_answers_as_the_general_path(api: Api, taken: dict[str, Any], case: str, body: Any,
                                                         cheap: bool) -> None:
    await _leases(api)
    fast, slow = await _both(api, taken, "PATCH", LEASES + "/{name}", body,
                             content_type="application/merge-patch+json", headers={"user-agent": "agent/1"})
    assert fast == slow
    assert taken["taken"] == (1 if cheap else 0), case


async def test_put_of_a_renewed_lease_and_strict_validation(api: Api, taken: dict[str, Any]) -> None:
    await _leases(api)

    def put(name: str) -> dict[str, Any]:
        obj = dict(reversed(list(_lease(name).items())))  # keys in another order than stored
        obj["spec"] = {**obj["spec"], "renewTime": "2026-12-07T10:01:00.25Z"}
        return obj

    fast, slow = await _both(api, taken, "PUT", LEASES + "/{name}", put, query={"fieldValidation": "Strict"})
    assert fast == slow and fast[0] == 200
    assert fast[2]["spec"]["renewTime"] == "2026-12-07T10:01:00.250000Z"
    assert taken["taken"] == 1


async def test_renewals_one_after_another_keep_ownership_as_the_general_path(api: Api, taken: dict[str, Any]) -> None:
    await _leases(api)
    for second in range(1, 6):
        fast, slow = await _both(api, taken, "PATCH", LEASES + "/{name}", _renew(f"2026-12-07T10:00:0{second}Z"),
                                 content_type="application/merge-patch+json",
                                 headers={"user-agent": f"agent/{second % 2}"})  # two managers by turns
        assert fast == slow and fast[0] == 200
    assert taken["taken"] == 5


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=st.one_of(
    st.datetimes(timezones=st.timezones()).map(lambda d: d.isoformat()),
    st.datetimes().map(lambda d: d.isoformat() + "Z"),
    st.text(max_size=30),
))
async def test_any_renew_time_answers_as_the_general_path(api: Api, taken: dict[str, Any], value: str) -> None:
    if taken.get("created") is None:
        await _leases(api)
        taken["created"] = True
    fast, slow = await _both(api, taken, "PATCH", LEASES + "/{name}", _renew(value),
                             content_type="application/merge-patch+json")
    assert fast == slow


def _heartbeat(time: str, ready: str = "True", extra: dict[str, Any] | None = None) -> Any:
    def make(name: str) -> dict[str, Any]:
        status = _node(name)["status"]
        for c in status["conditions"]:
            c["lastHeartbeatTime"] = time
            if c["type"] == "Ready":
                c["status"] = ready
        status.update(extra or {})
        return {"status": status}
    return make


NODE_CASES = [
    ("heartbeat", _heartbeat("2026-12-07T10:00:30Z"), True),
    ("heartbeat with an offset", _heartbeat("2026-12-07T11:00:30+01:00"), True),
    ("heartbeat not a time", _heartbeat("soon"), False),
    ("and Ready False", _heartbeat("2026-12-07T10:00:30Z", ready="False"), False),
    ("and allocatable", _heartbeat("2026-12-07T10:00:30Z", extra={"allocatable": {"cpu": "63", "nvidia.com/gpu": "8"}}),
     False),
]


@pytest.mark.parametrize("case,body,cheap", NODE_CASES, ids=[c[0] for c in NODE_CASES])
async def test_node_status_heartbeat_answers_as_the_general_path(api: Api, taken: dict[str, Any], case: str,
                                                                 body: Any, cheap: bool) -> None:
    for name in ("fast", "slow"):
        await api.create("/api/v1/nodes", _node(name))
    fast, slow = await _both(api, taken, "PATCH", "/api/v1/nodes/{name}/status", body,
                             content_type="application/merge-patch+json", headers={"user-agent": "agent/1"})
    assert fast == slow
    assert taken["taken"] == (1 if cheap else 0), case


@pytest.mark.parametrize("old,new,same", [
    ({"a": 40}, {"a": 40.0}, False),
    ({"a": [1, True]}, {"a": [1, 1]}, False),
    ({"a": {"b": 1, "c": 2}}, {"a": {"c": 2, "b": 1}}, True),
    ({"a": None}, {"a": None}, True),
])
def test_json_equality(old: Any, new: Any, same: bool) -> None:
    assert heartbeat._same(old, new) is same
