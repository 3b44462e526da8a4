"""What wakes the queue controller's admission cycle: changes that can change a decision
(a Node's allocatable, readiness, labels, taints; a pod's GPUs coming or going), never a
node's heartbeat, and nothing at all while there is no ClusterQueue."""

from __future__ import annotations

from typing import Any

import pytest
from ctrl_helpers import NS, eventually
from test_kueue import cluster_queue, flavor, gpu_node

from gpufleet.client.api import Client


@pytest.fixture
async def kueue(client: Client, controllers):
    manager = await controllers(enabled=("kueue",))
    return manager.controller("kueue")


async def heartbeat(client: Client, name: str, stamp: str) -> None:
    """What an agent writes every status period: the same conditions with new heartbeat times."""
    node = await client.get("nodes", name, raw=True)
    for c in node["status"]["conditions"]:
        c["lastHeartbeatTime"] = stamp
    await client.update_status(node)


async def set_gpus(client: Client, name: str, gpus: int) -> None:
    node = await client.get("nodes", name, raw=True)
    node["status"]["allocatable"]["nvidia.com/gpu"] = str(gpus)
    await client.update_status(node)


async def node_events_handled(ctrl: Any, n: int) -> None:
    await eventually(lambda: ctrl.events_seen["Node"] >= n, what=f"{n} Node events handled")


async def test_heartbeats_wake_no_pass_but_allocatable_changes_do(client: Client, kueue):
    await client.create(flavor("default"))
    await client.create(cluster_queue("team-a", 8))
    await gpu_node(client, "n1", 8)
    await gpu_node(client, "n2", 8)
    await eventually(lambda: kueue.passes >= 1, what="a first pass")
    await node_events_handled(kueue, 4)  # two adds, two status writes
    seen, pokes = kueue.events_seen["Node"], kueue.pokes["Node"]

    await heartbeat(client, "n1", "2026-01-01T00:00:30Z")
    await heartbeat(client, "n2", "2026-01-01T00:00:30Z")
    await set_gpus(client, "n1", 4)
    # One watch delivers a Node's events in order: both heartbeats were handled before this.
    await node_events_handled(kueue, seen + 3)
    assert kueue.pokes["Node"] == pokes + 1
    # The pass that allocatable change woke sees 4 GPUs on n1.
    await eventually(lambda: _queue_status(client), what="the queue's status written")


async def _queue_status(client: Client) -> bool:
    cq = await client.get("clusterqueues", "team-a", raw=True)
    return "status" in cq


async def test_readiness_taints_and_labels_wake_a_pass(client: Client, kueue):
    await client.create(flavor("default"))
    await client.create(cluster_queue("team-a", 8))
    await gpu_node(client, "n1", 8)
    await node_events_handled(kueue, 2)
    seen, pokes = kueue.events_seen["Node"], kueue.pokes["Node"]

    node = await client.get("nodes", "n1", raw=True)
    node["status"]["conditions"][0]["status"] = "False"
    await client.update_status(node)
    node = await client.get("nodes", "n1", raw=True)
    node["metadata"].setdefault("labels", {})["zone"] = "b"
    node = await client.update(node, raw=True)
    node["spec"]["taints"] = [{"key": "maintenance", "effect": "NoSchedule"}]
    await client.update(node)
    await node_events_handled(kueue, seen + 3)
    assert kueue.pokes["Node"] == pokes + 3


async def test_without_cluster_queues_nothing_runs(client: Client, kueue):
    await gpu_node(client, "n1", 8)
    await set_gpus(client, "n1", 4)
    await client.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": NS},
                         "spec": {"nodeName": "n1", "containers": [{
                             "name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
    await node_events_handled(kueue, 3)
    await eventually(lambda: kueue.events_seen["Pod"] >= 1, what="the pod's event handled")
    assert kueue.passes == 0
    assert kueue.pokes["Node"] == 0 and kueue.pokes["Pod"] == 0

    await client.create(cluster_queue("team-a", 8))
    await eventually(lambda: kueue.passes == 1, what="a pass once a ClusterQueue exists")


async def test_what_wakes_the_cycle_within_its_batch_period_is_decided_in_one_pass(client: Client, controllers):
    manager = await controllers(enabled=("kueue",), kueue_batch_period=1.0)
    kueue = manager.controller("kueue")
    await client.create(flavor("default"))
    await client.create(cluster_queue("team-a", 8))
    await gpu_node(client, "n1", 8)
    await gpu_node(client, "n2", 8)
    await node_events_handled(kueue, 4)
    await eventually(lambda: kueue.passes >= 1 and not len(kueue.cycle_queue) and not kueue.cycle_queue.waiting,
                     what="the first passes done")
    seen, passes, pokes = kueue.events_seen["Node"], kueue.passes, kueue.pokes["Node"]

    await set_gpus(client, "n1", 4)
    await set_gpus(client, "n2", 4)
    await set_gpus(client, "n1", 2)
    await node_events_handled(kueue, seen + 3)
    assert kueue.pokes["Node"] == pokes + 3
    await eventually(lambda: kueue.passes > passes, what="a pass after the batch period")
    await eventually(lambda: not kueue.cycle_queue.waiting, what="nothing more due")
    assert kueue.passes == passes + 1


@pytest.mark.parametrize(("annotation", "value", "says", "kind"), [
    ("gpufleet.io/attained-service-levels", "7200,3250", "each above the one before", "Invalid value"),
    ("gpufleet.io/attained-service-starvation-factor", "-1", "must be 0 (no guard) or more", "Invalid value"),
    ("gpufleet.io/attained-service-starvation-factor", "often", "is not a number", "Invalid value"),
    ("gpufleet.io/attained-service-order", "shortest", "supported values: fewest-gpus, fifo", "Unsupported value"),
])
async def test_a_bad_attained_service_annotation_makes_the_queue_inactive_naming_it(
        client: Client, kueue, annotation: str, value: str, says: str, kind: str):
    await client.create(flavor("default"))
    cq = cluster_queue("team-a", 8)
    cq["metadata"]["annotations"] = {"gpufleet.io/queueing-policy": "attained-service", annotation: value}
    await client.create(cq)

    async def active() -> dict[str, Any] | None:
        status = (await client.get("clusterqueues", "team-a", raw=True)).get("status") or {}
        return next((c for c in status.get("conditions") or [] if c["type"] == "Active"), None)

    cond = await eventually(active, what="the queue's Active condition")
    assert cond["status"] == "False"
    assert cond["message"].startswith(f"metadata.annotations[{annotation}]: {kind}: ")
    assert says in cond["message"]
