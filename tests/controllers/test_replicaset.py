from __future__ import annotations

from typing import Any

from ctrl_helpers import (
    NS,
    events_for,
    eventually,
    owned_pods,
    pod,
    replicaset,
    set_pod_status,
    stays,
)

from gpufleet.apiserver.errors import ApiException
from gpufleet.client.api import Client
from gpufleet.controllers._common import pod_deletion_rank, pods_to_delete

RS = ("replicaset",)


async def rs_status(client: Client, name: str) -> dict[str, Any]:
    return (await client.get("replicasets", name, NS, raw=True)).get("status") or {}


async def test_creates_and_deletes_pods_to_match_replicas(client: Client, controllers) -> None:
    await controllers(enabled=RS)
    rs = await client.create(replicaset("web", 3), raw=True)
    uid = rs["metadata"]["uid"]

    pods = await eventually(lambda: _count(client, uid, 3), what="3 pods")
    for p in pods:
        meta = p["metadata"]
        assert meta["name"].startswith("web-") and len(meta["name"]) == len("web-") + 5
        assert meta["labels"] == {"app": "web"}
        (ref,) = meta["ownerReferences"]
        assert ref == {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": uid,
                       "controller": True, "blockOwnerDeletion": True}
    # No second round of creates while the cache catches up.
    await stays(lambda: _count(client, uid, 3), 0.5)
    assert len(await events_for(client, "web", "SuccessfulCreate")) == 3

    # Scale down: the pod that is not ready goes first.
    ready = sorted(p["metadata"]["name"] for p in pods)[:2]
    for name in ready:
        await set_pod_status(client, name, phase="Running", ready=True)
    await client.patch("replicasets", "web", {"spec": {"replicas": 2}}, NS)
    remaining = await eventually(lambda: _count(client, uid, 2), what="2 pods")
    assert sorted(p["metadata"]["name"] for p in remaining) == ready

    status = await eventually(lambda: _status_is(client, "web", replicas=2, readyReplicas=2, availableReplicas=2))
    assert status["fullyLabeledReplicas"] == 2
    rs = await client.get("replicasets", "web", NS, raw=True)
    assert status["observedGeneration"] == rs["metadata"]["generation"] == 2


async def test_adopts_orphans_and_releases_pods_that_stop_matching(client: Client, controllers) -> None:
    await client.create(pod("orphan-1", {"app": "web"}))
    await client.create(pod("orphan-2", {"app": "web"}))
    await client.create(pod("other", {"app": "db"}))
    await controllers(enabled=RS)
    rs = await client.create(replicaset("web", 3), raw=True)
    uid = rs["metadata"]["uid"]

    pods = await eventually(lambda: _count(client, uid, 3))
    names = {p["metadata"]["name"] for p in pods}
    assert {"orphan-1", "orphan-2"} <= names and "other" not in names
    assert len(await events_for(client, "web", "SuccessfulCreate")) == 1

    # A pod relabelled away is released and replaced.
    await client.patch("pods", "orphan-1", {"metadata": {"labels": {"app": "debug"}}}, NS)
    released = await eventually(lambda: _no_owner(client, "orphan-1"))
    assert released["metadata"]["labels"] == {"app": "debug"}
    pods = await eventually(lambda: _count(client, uid, 3))
    assert "orphan-1" not in {p["metadata"]["name"] for p in pods}


async def test_replaces_failed_pods_and_ignores_deleting_ones(client: Client, controllers) -> None:
    await controllers(enabled=RS)
    rs = await client.create(replicaset("web", 2), raw=True)
    uid = rs["metadata"]["uid"]
    pods = await eventually(lambda: _count(client, uid, 2))
    failed = pods[0]["metadata"]["name"]
    await set_pod_status(client, failed, phase="Failed")

    pods = await eventually(lambda: _count(client, uid, 2, exclude={failed}))
    # The failed pod is left for inspection, not counted.
    assert (await client.get("pods", failed, NS, raw=True))["status"]["phase"] == "Failed"
    await eventually(lambda: _status_is(client, "web", replicas=2))

    # A pod stuck terminating (its node agent still stopping it) no longer counts either.
    stuck = pods[0]["metadata"]["name"]
    await client.patch("pods", stuck, {"metadata": {"finalizers": ["test/hold"]}}, NS)
    await client.delete("pods", stuck, NS)
    await eventually(lambda: _count(client, uid, 2, exclude={failed, stuck}))
    await client.patch("pods", stuck, {"metadata": {"finalizers": None}}, NS)


async def test_min_ready_seconds_delays_availability(client: Client, controllers) -> None:
    await controllers(enabled=RS)
    # Ready times are kept to the second (as Kubernetes keeps them): 3 s leaves at least 2 s
    # in which the pod is ready but not yet available, whatever the fraction it became ready at.
    rs = await client.create(replicaset("web", 1, minReadySeconds=3), raw=True)
    (p,) = await eventually(lambda: _count(client, rs["metadata"]["uid"], 1))
    await set_pod_status(client, p["metadata"]["name"], phase="Running", ready=True)
    status = await eventually(lambda: _status_is(client, "web", readyReplicas=1))
    assert "availableReplicas" not in status
    await eventually(lambda: _status_is(client, "web", readyReplicas=1, availableReplicas=1), timeout=8)


async def test_create_errors_become_a_replica_failure_condition(cp, client: Client, controllers) -> None:
    class Quota:
        name = "quota"
        blocked = True

        async def validate(self, ctx, obj, old) -> None:
            if self.blocked and ctx.operation == "CREATE" and ctx.rt.kind == "Pod":
                raise ApiException(403, "Forbidden", f'pods "{obj["metadata"]["name"]}" is forbidden: '
                                   "exceeded quota: gpus, requested: nvidia.com/gpu=1, used: 8, limited: 8")

    quota = Quota()
    cp.api.validating.append(quota)
    await controllers(enabled=RS)
    rs = await client.create(replicaset("web", 2), raw=True)
    status = await eventually(lambda: _condition(client, "web", "ReplicaFailure"))
    cond = status
    assert cond["status"] == "True" and cond["reason"] == "FailedCreate"
    assert "exceeded quota: gpus" in cond["message"] and cond["message"].startswith('pods "web-')
    event = (await events_for(client, "web", "FailedCreate"))[0]
    assert event["type"] == "Warning" and "exceeded quota" in event["message"]
    assert await owned_pods(client, rs["metadata"]["uid"]) == []

    quota.blocked = False
    await eventually(lambda: _count(client, rs["metadata"]["uid"], 2), timeout=15)
    await eventually(lambda: _no_condition(client, "web", "ReplicaFailure"), timeout=5)


def _p(name: str, *, node: str | None = None, phase: str = "Pending", ready: bool = False,
       created: str = "2024-01-01T00:00:00Z", ready_at: str = "2024-01-01T00:00:10Z") -> Any:
    from gpufleet.api.k8s import Pod

    status: dict[str, Any] = {"phase": phase}
    if ready:
        status["conditions"] = [{"type": "Ready", "status": "True", "lastTransitionTime": ready_at}]
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "x"}]}
    if node:
        spec["nodeName"] = node
    return Pod.from_dict({"metadata": {"name": name, "uid": name, "creationTimestamp": created},
                          "spec": spec, "status": status})


def test_scale_down_order_follows_kubernetes() -> None:
    pods = [
        _p("ready-old", node="n1", phase="Running", ready=True, ready_at="2024-01-01T00:00:10Z"),
        _p("ready-new", node="n2", phase="Running", ready=True, ready_at="2024-01-01T00:05:00Z"),
        _p("running-not-ready", node="n1", phase="Running"),
        _p("pending", node="n1"),
        _p("unscheduled"),
    ]
    order = [p.metadata.name for p in sorted(pods, key=pod_deletion_rank)]
    assert order == ["unscheduled", "pending", "running-not-ready", "ready-new", "ready-old"]
    # Doubled-up pods go before lone ones of the same standing.
    a = _p("a", node="n1", phase="Running", ready=True)
    b = _p("b", node="n2", phase="Running", ready=True)
    c = _p("c", node="n2", phase="Running", ready=True)
    assert {p.metadata.name for p in pods_to_delete([a, b, c], 1)} <= {"b", "c"}


async def _count(client: Client, uid: str, n: int, exclude: set[str] = frozenset()) -> list[dict[str, Any]] | None:
    pods = [p for p in await owned_pods(client, uid) if p["metadata"]["name"] not in exclude]
    all_pods = await owned_pods(client, uid)
    return pods if len(pods) == n and len(all_pods) == n else None


async def _status_is(client: Client, name: str, **want: int) -> dict[str, Any] | None:
    status = await rs_status(client, name)
    return status if all(status.get(k, 0) == v for k, v in want.items()) else None


async def _condition(client: Client, name: str, type_: str) -> dict[str, Any] | None:
    for c in (await rs_status(client, name)).get("conditions") or []:
        if c["type"] == type_:
            return c
    return None


async def _no_condition(client: Client, name: str, type_: str) -> bool:
    return await _condition(client, name, type_) is None


async def _no_owner(client: Client, name: str) -> dict[str, Any] | None:
    p = await client.get("pods", name, NS, raw=True)
    return p if not p["metadata"].get("ownerReferences") else None
