"""A RayCluster's minimum (head + minReplicas) is placed as one gang by the real scheduler:
on a fleet with too few GPUs no Ray pod is bound and the cluster reports the scheduler's
reason (status.reason, an Event Unschedulable); with a minimum that fits, the head and the
workers are bound together. In-process API server, scheduler and controllers; no agents."""

from __future__ import annotations

from typing import Any

from ctrl_helpers import NS, events_for, eventually, node

from gpufleet.client.api import Client
from gpufleet.client.errors import NotFound
from gpufleet.scheduler import Scheduler


def template(gpus: int) -> dict[str, Any]:
    limits = {"cpu": "1"} | ({"nvidia.com/gpu": str(gpus)} if gpus else {})
    return {"spec": {"containers": [{"name": "ray", "image": "rayproject/ray:2.60.0",
                                     "resources": {"limits": limits}}]}}


def raycluster(name: str, workers: int) -> dict[str, Any]:
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": name, "namespace": NS},
            "spec": {"headGroupSpec": {"template": template(0)},
                     "workerGroupSpecs": [{"groupName": "gpu", "replicas": workers, "minReplicas": workers,
                                           "maxReplicas": 4, "template": template(1)}]}}


async def ray_pods(client: Client, name: str) -> list[dict[str, Any]]:
    return await client.list("Pod", NS, label_selector={"ray.io/cluster": name}, raw=True)


async def test_the_minimum_is_placed_whole_or_waits_with_the_schedulers_reason(client: Client, controllers) -> None:
    n = await client.create(node("gpu-node"), raw=True)
    n["status"] = {"allocatable": {"nvidia.com/gpu": "2", "cpu": "16", "memory": "64Gi", "pods": "110"},
                   "capacity": {"nvidia.com/gpu": "2", "cpu": "16", "memory": "64Gi", "pods": "110"},
                   "conditions": [{"type": "Ready", "status": "True"}],
                   "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}]}
    await client.update_status(n, raw=True)
    scheduler = Scheduler(client, flush_interval=0.2)
    await scheduler.start(sync_timeout=10)
    try:
        await controllers(enabled=("raycluster", "podgroup"))
        # Head + 3 one-GPU workers on 2 GPUs: the gang does not fit, nothing is bound.
        await client.create(raycluster("big", 3), raw=True)
        async def podgroup() -> dict[str, Any] | None:
            try:
                return await client.get("podgroups", "big", NS, raw=True)
            except NotFound:
                return None

        pg = await eventually(podgroup, what="the cluster's PodGroup")
        assert pg["spec"]["minMember"] == 4

        async def reason() -> str | None:
            rc = await client.get("rayclusters", "big", NS, raw=True)
            return (rc.get("status") or {}).get("reason")

        # Workers come once the head exists; the head alone is not bound either (its gang waits).
        text = await eventually(reason, timeout=20, what="the scheduler's reason on the cluster")
        assert "minMember 4" in text or "nvidia.com/gpu" in text, text
        assert not [p for p in await ray_pods(client, "big") if p["spec"].get("nodeName")]
        # The reason may be refined as the gang's members arrive: each distinct one is an Event.
        events = await eventually(lambda: events_for(client, "big", "Unschedulable"), what="an Event")
        assert all(e["message"].startswith("Ray pods wait to be placed: ") for e in events), events

        # A minimum that fits (head + 2 workers) is bound together.
        await client.delete("rayclusters", "big", NS)
        await client.create(raycluster("fits", 2), raw=True)

        async def bound() -> list[dict[str, Any]] | None:
            pods = await ray_pods(client, "fits")
            placed = [p for p in pods if p["spec"].get("nodeName") == "gpu-node"]
            return placed if len(placed) == 3 else None

        placed = await eventually(bound, timeout=20, what="head and 2 workers bound")
        roles = sorted(p["metadata"]["labels"]["ray.io/node-type"] for p in placed)
        assert roles == ["head", "worker", "worker"]
    finally:
        await scheduler.stop()
