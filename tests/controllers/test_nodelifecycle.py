from __future__ import annotations

import time
from typing import Any

from ctrl_helpers import NS, Heartbeat, events_for, eventually, node, pod, set_pod_status, stays

from gpufleet.client.api import Client
from gpufleet.client.errors import NotFound
from gpufleet.controllers.nodelifecycle import eviction_delay, tolerates

NLC = {"enabled": ("nodelifecycle",), "node_monitor_grace_period": 1.0, "default_eviction_seconds": 1.0}


async def get_node(client: Client, name: str) -> dict[str, Any]:
    return await client.get("nodes", name, raw=True)


def taints(n: dict[str, Any]) -> set[tuple[str, str]]:
    return {(t["key"], t["effect"]) for t in n.get("spec", {}).get("taints") or []}


def ready_condition(n: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in n["status"]["conditions"] if c["type"] == "Ready")


async def pod_gone(client: Client, name: str) -> bool:
    try:
        await client.get("pods", name, NS, raw=True)
    except NotFound:
        return True
    return False


UNREACHABLE = {("node.kubernetes.io/unreachable", "NoSchedule"), ("node.kubernetes.io/unreachable", "NoExecute")}


async def test_stale_lease_fences_the_node_and_evicts_its_pods(client: Client, controllers) -> None:
    hb = Heartbeat(client, "gpu-1")
    await hb.register()
    hb.start()
    await client.create(pod("plain", {"app": "x"}, node="gpu-1"))
    await client.create(pod("patient", {"app": "x"}, node="gpu-1", tolerations=[
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
         "tolerationSeconds": 3600}]))
    await client.create(pod("forever", {"app": "x"}, node="gpu-1", tolerations=[{"operator": "Exists"}]))
    for name in ("plain", "patient", "forever"):
        await set_pod_status(client, name, phase="Running", ready=True)
    try:
        await controllers(**NLC)
        # Heartbeats keep it untouched.
        await stays(lambda: _untainted(client, "gpu-1"), 1.5)

        await hb.stop()
        stopped = time.monotonic()
        n = await eventually(lambda: _has_taints(client, "gpu-1", UNREACHABLE), timeout=5, what="unreachable taints")
        fenced = time.monotonic()
        # The last renewal came up to one interval (0.2 s) before the heartbeat stopped.
        assert fenced - stopped >= 0.7
        ready = ready_condition(n)
        assert (ready["status"], ready["reason"], ready["message"]) == (
            "Unknown", "NodeStatusUnknown", "Kubelet stopped posting node status.")
        assert all(t.get("timeAdded") for t in n["spec"]["taints"])
        for name in ("plain", "patient", "forever"):
            p = await eventually(lambda name=name: _not_ready(client, name), timeout=3)
            assert p["status"]["phase"] == "Running"

        await eventually(lambda: pod_gone(client, "plain"), timeout=5, what="plain evicted")
        assert time.monotonic() - fenced >= 0.5
        # Events are recorded beside the eviction, not before it: wait for the Event too.
        (event,) = await eventually(lambda: events_for(client, "plain", "TaintManagerEviction"), timeout=5,
                                    what="the eviction's Event")
        assert event["message"] == "Marking for deletion Pod default/plain"
        await stays(lambda: _exist(client, "patient", "forever"), 0.5)

        # The lease moves again: the fence comes down and the agent reports Ready itself.
        hb.start()
        n = await eventually(lambda: _has_taints(client, "gpu-1", set()), timeout=5, what="taints removed")
        assert ready_condition(n)["status"] == "Unknown"
        await hb.post_ready("True")
        await stays(lambda: _untainted(client, "gpu-1"), 0.5)
    finally:
        await hb.stop()
    async def reasons() -> set[str]:
        have = {e["reason"] for e in await events_for(client, "gpu-1")}
        return have if {"RegisteredNode", "NodeNotReady", "NodeReady"} <= have else set()

    await eventually(reasons, timeout=5, what="the node's Events")


async def test_not_ready_untolerated_taints_and_cordon(client: Client, controllers) -> None:
    hb = Heartbeat(client, "gpu-2")
    await hb.register()
    hb.start()
    try:
        await client.create(pod("victim", {"app": "x"}, node="gpu-2"))
        await client.create(pod("guest", {"app": "x"}, node="gpu-2", tolerations=[
            {"key": "maintenance", "operator": "Equal", "value": "now", "effect": "NoExecute"}]))
        await controllers(**NLC)
        await client.patch("nodes", "gpu-2", {"spec": {"unschedulable": True, "taints": [
            {"key": "maintenance", "value": "now", "effect": "NoExecute"}]}})
        # The node's agent is alive: eviction is a graceful delete that the agent finishes.
        await eventually(lambda: _deleting(client, "victim"), timeout=3, what="untolerated pod evicted")
        n = await eventually(lambda: _has_taints(client, "gpu-2", {
            ("maintenance", "NoExecute"), ("node.kubernetes.io/unschedulable", "NoSchedule")}))
        assert n["spec"]["unschedulable"] is True

        await hb.post_ready("False")
        await eventually(lambda: _has_taints(client, "gpu-2", {
            ("maintenance", "NoExecute"), ("node.kubernetes.io/unschedulable", "NoSchedule"),
            ("node.kubernetes.io/not-ready", "NoSchedule"), ("node.kubernetes.io/not-ready", "NoExecute")}))
        # guest tolerates maintenance but not-ready only for the default 1 s.
        await eventually(lambda: _deleting(client, "guest"), timeout=5)
        await hb.post_ready("True")
        await eventually(lambda: _has_taints(client, "gpu-2", {
            ("maintenance", "NoExecute"), ("node.kubernetes.io/unschedulable", "NoSchedule")}))
    finally:
        await hb.stop()


async def test_pods_of_a_deleted_node_are_removed(client: Client, controllers) -> None:
    await client.create(node("gone"))
    await client.create(pod("orphan", {"app": "x"}, node="gone"))
    await controllers(**NLC)
    await client.delete("nodes", "gone")
    await eventually(lambda: pod_gone(client, "orphan"), timeout=5)


def test_toleration_matching_and_delays() -> None:
    from gpufleet.api.k8s import Pod

    taint = {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}
    assert tolerates({"operator": "Exists"}, taint)
    assert tolerates({"key": "node.kubernetes.io/unreachable", "operator": "Exists"}, taint)
    assert not tolerates({"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoSchedule"}, taint)
    assert not tolerates({"key": "other", "operator": "Exists"}, taint)
    assert tolerates({"key": "k", "value": "v"}, {"key": "k", "value": "v", "effect": "NoExecute"})

    def p(tolerations: list[dict[str, Any]]) -> Pod:
        return Pod.from_dict({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}],
                                                                   "tolerations": tolerations}})

    assert eviction_delay(p([]), [taint], 2.0) == 2.0
    assert eviction_delay(p([{"operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}]), [taint], 2.0) == 30
    assert eviction_delay(p([{"operator": "Exists"}]), [taint], 2.0) is None
    assert eviction_delay(p([]), [taint, {"key": "gpu-broken", "effect": "NoExecute"}], 2.0) == 0.0


async def _untainted(client: Client, name: str) -> bool:
    n = await get_node(client, name)
    return not taints(n) and ready_condition(n)["status"] == "True"


async def _has_taints(client: Client, name: str, want: set[tuple[str, str]]) -> dict[str, Any] | None:
    n = await get_node(client, name)
    return n if taints(n) == want else None


async def _not_ready(client: Client, name: str) -> dict[str, Any] | None:
    p = await client.get("pods", name, NS, raw=True)
    ready = next(c for c in p["status"]["conditions"] if c["type"] == "Ready")
    return p if ready["status"] == "False" else None


async def _deleting(client: Client, name: str) -> bool:
    p = await client.get("pods", name, NS, raw=True)
    return bool(p["metadata"].get("deletionTimestamp")) and p["metadata"].get("deletionGracePeriodSeconds") == 30


async def _exist(client: Client, *names: str) -> bool:
    for name in names:
        if await pod_gone(client, name):
            return False
    return True
