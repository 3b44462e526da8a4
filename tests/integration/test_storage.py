"""Persistent storage end to end on one control plane: the scheduler, the PV controller, the
local-path provisioner and a node's cleanup, each the real one.

A pod using a WaitForFirstConsumer claim is scheduled; the claim is given the node; a
volume is provisioned pinned to that node; the claim binds and the pod binds. Deleting the
pod and the claim deletes the volume, and the node removes its directory. A pod whose claim
does not exist waits, and says why.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from gpufleet.agent.bootstrap import node_token
from gpufleet.agent.localpath import LocalPathCleanup
from gpufleet.api import storage
from gpufleet.cli.controlplane import ControlPlane
from gpufleet.client import Client, HttpTransport, NotFound
from gpufleet.controllers.manager import start_controllers
from gpufleet.scheduler import Scheduler

NS = "default"
NODE = "gpu-1"


async def eventually(check: Callable[[], Awaitable[Any]], limit_s: float = 20.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + limit_s
    while True:
        result = await check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}: last {result!r}")
        await asyncio.sleep(0.05)


@pytest.fixture
async def cp(tmp_path: Path) -> AsyncIterator[ControlPlane]:
    plane = ControlPlane(store_url=f"sqlite:///{tmp_path / 'db'}", port=0, state_dir=tmp_path / "state",
                         run_controllers=False)
    await plane.start()
    yield plane
    await plane.stop()


def node(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {storage.HOSTNAME_LABEL: name}},
            "status": {"allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110", "nvidia.com/gpu": "8"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def trainer(name: str, claim_name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": {"containers": [{"name": "main", "image": "trainer",
                                     "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
                                     "volumeMounts": [{"name": "ckpt", "mountPath": "/ckpt"}]}],
                     "volumes": [{"name": "ckpt", "persistentVolumeClaim": {"claimName": claim_name}}]}}


async def obj(client: Client, kind: str, name: str, ns: str | None = None) -> dict[str, Any] | None:
    try:
        return await client.get(kind, name, ns, raw=True)
    except NotFound:
        return None


async def test_a_checkpoint_volume_from_claim_to_cleanup(cp: ControlPlane, tmp_path: Path) -> None:
    assert cp.client is not None
    client = cp.client
    node_path = tmp_path / "local-path"
    node_path.mkdir()
    manager = await start_controllers(client, enabled=("persistentvolume", "localpath"),
                                      local_path_node_path=str(node_path))
    scheduler = Scheduler(client)
    await client.create(node(NODE), raw=True)
    await client.create(node("gpu-2"), raw=True)
    await scheduler.start(sync_timeout=10)

    def connect(token: str | None) -> Client:
        return Client(HttpTransport(cp.url, token=token, ca_data=cp.ca_pem), read_retries=1)

    # Each node's agent cleans up after its own volumes, with its own token.
    agents = [connect(await node_token(connect, cp.join_token, name, tmp_path / f"agent-{name}"))
              for name in (NODE, "gpu-2")]
    cleanups = [LocalPathCleanup(agent, name) for agent, name in zip(agents, (NODE, "gpu-2"), strict=True)]
    for cleanup in cleanups:
        await cleanup.start()
    try:
        await client.create({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                             "metadata": {"name": "ckpt", "namespace": NS},
                             "spec": {"accessModes": ["ReadWriteOnce"],
                                      "resources": {"requests": {"storage": "50Gi"}}}}, raw=True)
        await client.create(trainer("train-0", "ckpt"), raw=True)

        pod = await eventually(lambda: _scheduled(client, "train-0"), what="the pod to be bound")
        chosen = pod["spec"]["nodeName"]
        pvc = await client.get("persistentvolumeclaims", "ckpt", NS, raw=True)
        assert pvc["spec"]["storageClassName"] == storage.LOCAL_PATH_CLASS
        assert pvc["metadata"]["annotations"][storage.ANN_SELECTED_NODE] == chosen
        # The pod is bound only once its claim is.
        assert pvc["status"]["phase"] == "Bound"
        pv = await client.get("persistentvolumes", pvc["spec"]["volumeName"], raw=True)
        assert pv["metadata"]["name"] == f"pvc-{pvc['metadata']['uid']}"
        assert storage.pinned_nodes(pv) == {chosen}
        assert pv["spec"]["capacity"] == {"storage": "50Gi"}
        assert pv["status"]["phase"] == "Bound"
        directory = Path(pv["spec"]["hostPath"]["path"])
        assert directory.parent == node_path

        # A second pod of the same claim goes where its volume is.
        await client.create(trainer("train-1", "ckpt"), raw=True)
        second = await eventually(lambda: _scheduled(client, "train-1"), what="the second pod to be bound")
        assert second["spec"]["nodeName"] == chosen

        # What the node's agent does when the pod starts (hostPath DirectoryOrCreate).
        _write_checkpoint(directory)
        for name in ("train-0", "train-1"):
            await client.delete("pods", name, NS, grace_period_seconds=0)
        await client.delete("persistentvolumeclaims", "ckpt", NS)
        await eventually(lambda: _gone(client, "persistentvolumes", pv["metadata"]["name"]),
                         what="the volume to be deleted")
        assert not _exists(directory)
        assert _exists(node_path)
    finally:
        for cleanup in cleanups:
            await cleanup.stop()
        for agent in agents:
            await agent.close()
        await scheduler.stop()
        await manager.stop()


async def test_a_claim_in_use_keeps_its_volume_and_directory(cp: ControlPlane, tmp_path: Path) -> None:
    assert cp.client is not None
    client = cp.client
    node_path = tmp_path / "local-path"
    node_path.mkdir()
    manager = await start_controllers(client, enabled=("persistentvolume", "localpath"),
                                      local_path_node_path=str(node_path))
    scheduler = Scheduler(client)
    await client.create(node(NODE), raw=True)
    await scheduler.start(sync_timeout=10)

    def connect(token: str | None) -> Client:
        return Client(HttpTransport(cp.url, token=token, ca_data=cp.ca_pem), read_retries=1)

    agent_client = connect(await node_token(connect, cp.join_token, NODE, tmp_path / "agent"))
    cleanup = LocalPathCleanup(agent_client, NODE)
    await cleanup.start()
    try:
        await client.create({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                             "metadata": {"name": "data", "namespace": NS},
                             "spec": {"accessModes": ["ReadWriteOnce"],
                                      "resources": {"requests": {"storage": "1Gi"}}}}, raw=True)
        await client.create(trainer("train", "data"), raw=True)
        pod = await eventually(lambda: _scheduled(client, "train"), what="the pod to be bound")
        assert pod["spec"]["nodeName"] == NODE
        pvc = await client.get("persistentvolumeclaims", "data", NS, raw=True)
        pv = await client.get("persistentvolumes", pvc["spec"]["volumeName"], raw=True)
        directory = Path(pv["spec"]["hostPath"]["path"])
        _write_checkpoint(directory)
        await client.delete("persistentvolumeclaims", "data", NS)
        # Still used by a pod on the node: the claim waits, and so do volume and directory.
        await asyncio.sleep(0.3)
        held = await client.get("persistentvolumeclaims", "data", NS, raw=True)
        assert held["metadata"]["finalizers"] == [storage.PVC_PROTECTION_FINALIZER]
        assert _exists(directory)
        await client.delete("pods", "train", NS, grace_period_seconds=0)
        await eventually(lambda: _gone(client, "persistentvolumes", pv["metadata"]["name"]),
                         what="the volume to be deleted")
        assert not _exists(directory)
    finally:
        await cleanup.stop()
        await agent_client.close()
        await scheduler.stop()
        await manager.stop()


async def test_a_pod_whose_claim_is_missing_waits_and_says_why(cp: ControlPlane) -> None:
    assert cp.client is not None
    client = cp.client
    scheduler = Scheduler(client)
    await client.create(node(NODE), raw=True)
    await scheduler.start(sync_timeout=10)
    try:
        await client.create(trainer("train", "data"), raw=True)
        condition = await eventually(lambda: _unschedulable(client, "train"), what="the PodScheduled condition")
        assert condition["message"] == ('0/1 nodes are available: persistentvolumeclaim "data" not found. '
                                        "preemption: 0/1 nodes are available: 1 Preemption is not helpful for "
                                        "scheduling.")
        events = (await client.list("events", NS, field_selector={"involvedObject.name": "train"}, raw=True)).items
        assert [e["reason"] for e in events] == ["FailedScheduling"]
        # An Immediate class binds before any pod is placed: its pods wait for it.
        await client.create({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": "nfs"},
                             "provisioner": "example.com/nfs"}, raw=True)
        await client.create({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                             "metadata": {"name": "data", "namespace": NS},
                             "spec": {"storageClassName": "nfs", "accessModes": ["ReadWriteMany"],
                                      "resources": {"requests": {"storage": "1Gi"}}}}, raw=True)
        condition = await eventually(lambda: _unschedulable(client, "train", "unbound immediate"),
                                     what="the new reason")
        assert condition["message"].startswith(
            "0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims.")
    finally:
        await scheduler.stop()


async def _scheduled(client: Client, name: str) -> dict[str, Any] | None:
    pod = await obj(client, "pods", name, NS)
    return pod if pod is not None and pod["spec"].get("nodeName") else None


async def _unschedulable(client: Client, name: str, containing: str = "") -> dict[str, Any] | None:
    pod = await obj(client, "pods", name, NS)
    for c in ((pod or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == "PodScheduled" and c["status"] == "False" and containing in c.get("message", ""):
            return c
    return None


async def _gone(client: Client, kind: str, name: str) -> bool:
    return await obj(client, kind, name) is None


def _write_checkpoint(directory: Path) -> None:
    directory.mkdir(parents=True)
    (directory / "step-100.pt").write_bytes(b"weights")


def _exists(path: Path) -> bool:
    return path.exists()
