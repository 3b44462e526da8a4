"""Every controller together: a server dies, its pods come back elsewhere."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from ctrl_helpers import NS, FakeAgent, Heartbeat, deployment, eventually

from gpufleet.client.api import Client
from gpufleet.client.errors import ApiError
from gpufleet.controllers.manager import ALL_CONTROLLERS, ControllerManager, ControllerOptions


class FakeScheduler:
    """Binds pending pods to the first node that is schedulable and not tainted NoSchedule."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.task: asyncio.Task[None] | None = None

    async def step(self) -> None:
        nodes = [n for n in await self.client.list("nodes", raw=True)
                 if not n["spec"].get("unschedulable")
                 and not any(t["effect"] == "NoSchedule" for t in n["spec"].get("taints") or [])]
        if not nodes:
            return
        for p in await self.client.list("pods", NS, raw=True):
            if p["spec"].get("nodeName") or p["metadata"].get("deletionTimestamp"):
                continue
            target = sorted(n["metadata"]["name"] for n in nodes)[0]
            with contextlib.suppress(ApiError):
                await self.client.raw_request("POST", f"/api/v1/namespaces/{NS}/pods/{p['metadata']['name']}/binding",
                                              json={"apiVersion": "v1", "kind": "Binding",
                                                    "metadata": {"name": p["metadata"]["name"]},
                                                    "target": {"apiVersion": "v1", "kind": "Node", "name": target}})

    async def __aenter__(self) -> FakeScheduler:
        async def loop() -> None:
            while True:
                await self.step()
                await asyncio.sleep(0.05)

        self.task = asyncio.create_task(loop())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.task is not None
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


async def test_pods_of_a_dead_server_are_replaced_elsewhere(client: Client, controllers) -> None:
    manager = await controllers(node_monitor_grace_period=1.0, default_eviction_seconds=0.5)
    assert [type(c).__name__ for c in manager.controllers] == [
        "NamespaceController", "ServiceAccountsController", "RootCACertPublisher", "ReplicaSetController",
        "DeploymentController", "StatefulSetController", "DaemonSetController", "JobController", "CronJobController",
        "NodeLifecycleController", "EndpointsController", "EndpointSliceController", "GarbageCollector", "ResourceQuotaController",
        "DisruptionController", "HorizontalPodAutoscalerController", "PyTorchJobController", "KueueController",
        "NodeIpamController", "PersistentVolumeController", "LocalPathProvisioner", "PodGroupController",
        "VolcanoJobController", "VolcanoQueueController", "RayClusterController", "RayJobController",
        "RayServiceController"]
    a, b = Heartbeat(client, "a-node"), Heartbeat(client, "b-node")
    for hb in (a, b):
        await hb.register()
        hb.start()
    try:
        await client.create({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": NS},
                             "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]}})
        async with FakeScheduler(client), FakeAgent(client, delay=0.05):
            await client.create(deployment("web", 2))
            await eventually(lambda: _running_on(client, {"a-node": 2}), what="both pods on a-node")
            await eventually(lambda: _endpoint_nodes(client, ["a-node", "a-node"]))

            await a.stop()
            # a-node is fenced, its pods evicted (force: nobody is there to stop them) and
            # recreated by the ReplicaSet; the scheduler can only pick b-node now.
            await eventually(lambda: _running_on(client, {"b-node": 2}), timeout=15, what="pods moved to b-node")
            await eventually(lambda: _endpoint_nodes(client, ["b-node", "b-node"]), timeout=5)
            # The Deployment's status follows its ReplicaSet's, a sync or two after the pods.
            async def available() -> bool:
                d = await client.get("deployments", "web", NS, raw=True)
                return d["status"].get("availableReplicas") == 2

            await eventually(available, timeout=5, what="the Deployment reports 2 available")
    finally:
        await a.stop()
        await b.stop()


def test_options_are_checked() -> None:
    with pytest.raises(TypeError, match="unknown controller options: nope"):
        ControllerManager(None, nope=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown controllers: typo"):
        ControllerManager(None, enabled=("typo",))  # type: ignore[arg-type]
    assert ControllerOptions().node_monitor_grace_period == 8.0
    assert ControllerOptions().default_eviction_seconds == 2.0
    assert "garbagecollector" in ALL_CONTROLLERS


async def _running_on(client: Client, want: dict[str, int]) -> bool:
    counts: dict[str, int] = {}
    for p in await client.list("pods", NS, raw=True):
        if p["metadata"].get("deletionTimestamp") or (p.get("status") or {}).get("phase") != "Running":
            continue
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions") or [])
        if ready:
            counts[p["spec"].get("nodeName")] = counts.get(p["spec"].get("nodeName"), 0) + 1
    return counts == want


async def _endpoint_nodes(client: Client, want: list[str]) -> Any:
    try:
        ep = await client.get("endpoints", "web", NS, raw=True)
    except ApiError:
        return None
    nodes = sorted(a.get("nodeName") for s in ep.get("subsets") or [] for a in s.get("addresses") or [])
    return ep if nodes == want else None
