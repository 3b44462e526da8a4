"""The DaemonSet controller against a real API server and the real scheduler, on simulated
nodes (Node objects with a status) and a stand-in for their agents."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from ctrl_helpers import NS, FakeAgent, eventually, template

from gpufleet.cli.controlplane import ControlPlane
from gpufleet.client.api import Client

DS = ("daemonset", "garbagecollector", "nodelifecycle")


@pytest.fixture
async def cp(tmp_path: Path) -> AsyncIterator[ControlPlane]:
    """The control plane with its scheduler (daemon pods are placed by it), no controllers."""
    plane = ControlPlane(store_url="sqlite:///" + str(tmp_path / "db"), port=0, state_dir=tmp_path,
                         run_controllers=False, run_scheduler=True)
    await plane.start()
    yield plane
    await plane.stop()


async def join(client: Client, name: str, **labels: str) -> None:
    await client.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}})
    node = await client.get("nodes", name, raw=True)
    node["status"] = {"capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"},
                      "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"},
                      "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}
    await client.update_status(node)


def daemonset(name: str, image: str = "agent:v1", **spec: Any) -> dict[str, Any]:
    labels = {"app": name}
    tmpl = template(labels, image, nodeSelector={"role": "worker"})
    return {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": name, "namespace": NS},
            "spec": {"selector": {"matchLabels": labels}, "template": tmpl, **spec}}


async def placement(client: Client, name: str) -> dict[str, str]:
    """node -> image of the set's live pods, once every one of them is bound."""
    out: dict[str, str] = {}
    for p in await client.list("pods", NS, raw=True):
        if p["metadata"]["labels"].get("app") != name or p["metadata"].get("deletionTimestamp"):
            continue
        node = p["spec"].get("nodeName")
        if not node:
            return {"unbound": p["metadata"]["name"]}
        out[node] = p["spec"]["containers"][0]["image"]
    return out


async def test_a_daemonset_follows_nodes_joining_leaving_and_relabelled(client: Client, controllers) -> None:
    for name, role in (("n1", "worker"), ("n2", "worker"), ("login", "login")):
        await join(client, name, role=role)
    # The node lifecycle controller deletes the pods of a node that is gone; these nodes have
    # no heartbeat, so its grace period is set long enough never to find them unreachable.
    await controllers(enabled=DS, node_monitor_grace_period=300.0)
    async with FakeAgent(client, delay=0.05):
        await client.create(daemonset("logs"), raw=True)

        async def placed(want: dict[str, str]):
            return await placement(client, "logs") == want

        await eventually(lambda: placed({"n1": "agent:v1", "n2": "agent:v1"}), what="a pod on each worker")
        pod = next(p for p in await client.list("pods", NS, raw=True) if p["spec"].get("nodeName") == "n1")
        assert pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
            "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}
        assert pod["metadata"]["ownerReferences"][0]["kind"] == "DaemonSet"

        async def status_is(**want: int):
            s = (await client.get("daemonsets", "logs", NS, raw=True)).get("status") or {}
            return s if all(s.get(k) == v for k, v in want.items()) else None

        await eventually(lambda: status_is(desiredNumberScheduled=2, currentNumberScheduled=2, numberReady=2,
                                           numberAvailable=2, updatedNumberScheduled=2, numberMisscheduled=0),
                         what="status of two")

        # A node joins: it gets the daemon. One relabelled away loses it. One leaving takes its pod.
        await join(client, "n3", role="worker")
        await eventually(lambda: placed({"n1": "agent:v1", "n2": "agent:v1", "n3": "agent:v1"}), what="on n3")
        await client.patch("nodes", "n2", {"metadata": {"labels": {"role": "login"}}})
        await eventually(lambda: placed({"n1": "agent:v1", "n3": "agent:v1"}), what="gone from n2")
        await client.delete("nodes", "n1")
        await eventually(lambda: placed({"n3": "agent:v1"}), what="gone with n1")
        await eventually(lambda: status_is(desiredNumberScheduled=1, numberReady=1), what="status of one")

        # A rolling update replaces it; the revisions record both templates.
        await join(client, "n4", role="worker")
        await eventually(lambda: placed({"n3": "agent:v1", "n4": "agent:v1"}), what="on n4")
        await client.patch("daemonsets", "logs", {"spec": {"template": {"spec": {"containers": [
            {"name": "main", "image": "agent:v2"}]}}}}, NS)
        await eventually(lambda: placed({"n3": "agent:v2", "n4": "agent:v2"}), what="rolled to v2")
        await eventually(lambda: status_is(updatedNumberScheduled=2, numberAvailable=2), what="rolled status")
        revisions = sorted(r["revision"] for r in await client.list("controllerrevisions", NS, raw=True))
        assert revisions == [1, 2]

        # Deleting the set takes its pods.
        await client.delete("daemonsets", "logs", NS)
        await eventually(lambda: placed({}), what="pods collected")
